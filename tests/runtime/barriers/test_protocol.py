"""What every barrier handler shares (`runtime.barriers.protocol`): the input-channel checks that
raise `BarrierProtocolError`, run against both handlers."""

from __future__ import annotations

import pytest

from runtime.barriers import BarrierProtocolError
from runtime.barriers.protocol import channel_set
from tests.runtime.barriers.scripts import (
    FakeClock,
    HandlerFactory,
    RecordingActions,
    aligner,
    barrier,
    cancel,
    tracker,
)


@pytest.mark.parametrize("factory", [aligner, tracker])
def test_events_on_ended_or_unknown_channels_are_protocol_errors(
    factory: HandlerFactory,
) -> None:
    handler = factory([0, 1], RecordingActions(), FakeClock())
    handler.on_end_of_input(1)
    with pytest.raises(BarrierProtocolError, match="after its end of input"):
        handler.on_barrier(1, barrier(1))
    with pytest.raises(BarrierProtocolError, match="after its end of input"):
        handler.on_cancel(1, cancel(1))
    with pytest.raises(BarrierProtocolError, match="after its end of input"):
        handler.on_end_of_input(1)
    with pytest.raises(BarrierProtocolError, match=r"unknown channel 7.*\[0, 1\]"):
        handler.on_barrier(7, barrier(1))


@pytest.mark.parametrize("factory", [aligner, tracker])
def test_handler_needs_distinct_input_channels(factory: HandlerFactory) -> None:
    with pytest.raises(BarrierProtocolError, match="at least one regular input channel"):
        factory([], RecordingActions(), FakeClock())
    with pytest.raises(BarrierProtocolError, match="distinct"):
        factory([0, 0], RecordingActions(), FakeClock())


def test_back_edges_must_be_distinct_from_each_other_and_the_regular_inputs() -> None:
    assert channel_set([0, 1], back_edges=[8, 9]) == frozenset({0, 1})
    with pytest.raises(BarrierProtocolError, match=r"got \[0, 1\] and back-edges \[1\]"):
        channel_set([0, 1], back_edges=[1])
    with pytest.raises(BarrierProtocolError, match="distinct"):
        channel_set([0, 1], back_edges=[8, 8])
