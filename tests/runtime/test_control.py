"""Every control-plane message survives encode -> decode."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import pytest

from runtime import control as P
from statebackend.incremental import StateRef
from statebackend.metadata import OperatorLayout, TaskStateHandle
from statebackend.metrics import AckMetrics, TaskMetrics


def tuples(value: Any) -> Any:
    """What msgpack with use_list=False gives back: sequences as tuples."""
    if isinstance(value, list | tuple):
        return tuple(tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: tuples(v) for k, v in value.items()}
    return value


R = P.CheckpointFailureReason
HANDLE = TaskStateHandle(
    "count[0].state",
    812,
    0xDEADBEEF,
    {"count": OperatorLayout(0, 2, (0, 64)), "split": OperatorLayout(0, 2)},
)
INLINE = TaskStateHandle(
    "",
    5,
    7,
    {"count": OperatorLayout(1, 2, (64, 128))},
    inline=b"ABSF\x00",
    chains={
        "count": (
            StateRef("shared/count[1]/3-0-base-ab.state", 900, 11, True, (64, 128), (0, 128)),
            StateRef("shared/count[1]/4-0-delta-cd.state", 40, 12, False, (64, 128), (64, 128)),
        )
    },
)

MESSAGES: list[P.Message] = [
    P.Register(3, 1, "count[1]", 4242, "worker-7", "tcp://10.0.0.7:5555"),
    P.Heartbeat(
        0,
        0,
        TaskMetrics(
            records_in=1000,
            records_out=998,
            rss_bytes=123_456_789,
            first_record_at=1_700_000_000.25,
            watermark=17.5,
        ),
    ),
    P.Heartbeat(0, 0, TaskMetrics()),
    P.Ack(2, 1, 7, HANDLE, AckMetrics(alignment_ms=1.5, sync_ms=0.2, keys=10)),
    P.Ack(2, 1, 8, INLINE, AckMetrics(channel_state_records=3, drained_sent=4)),
    P.Ack(2, 1, 9, None, AckMetrics()),
    *[P.Decline(1, 0, 9, reason, "disk full") for reason in R],
    P.SourceEnded(0, 2),
    P.SinkOutput(4, 0, "out", 1, 12, [1, "two", [3, 4], {"k": b"v"}, None, 2.5, True]),
    P.SinkOutput(4, 0, "out", 1, 13, []),
    P.Finished(5, 0, TaskMetrics(records_in=10, records_out=9)),
    *[
        P.Failed(5, 0, cause, "map", 1, "ZeroDivisionError: division by zero", "Tb ...", False)
        for cause in P.TaskFailureCause
    ],
    P.Closed(5, 1),
    P.LoopStatus(3, 1, 7, 12_345, 12_340),
    P.LoopStatus(3, 1, 8, 5, 5, 42),
    P.Trigger(11, 1_700_000_001.5, False),
    P.Trigger(12, 1_700_000_002.0, True),
    P.Complete(11),
    *[P.Abort(11, reason) for reason in R],
    P.Cancel("attempt 2 failed"),
    P.Alive(),
    P.LoopProbe(7),
    P.LoopProbe(8, 42),
    P.Halt(42),
    P.KillSelf(9, "Kill('count[1]', after_checkpoint=2)"),
    P.SuperstepDone(2, 1, 7, 0.125, 40, 1_000, 1_000, 0.5),
    P.SuperstepDone(0, 0, 1, 0.0, 0, 0, 0, 0.0),
    P.SolutionEmitted(2, 1, 7, 40),
    P.SuperstepGo(8),
    P.SuperstepGo(9, snapshot_before=4),
    P.SuperstepGo(10, snapshot_after=5),
    P.EmitSolution(7),
    P.Rescued(2, 0, 9, 4, HANDLE),
    P.Rescued(1, 0, 9, -1, None),
    P.CompensationInput(2, 1, b"\x00frame", b""),
    P.Compensated(2, 1, 17),
    P.Rescue(9),
    P.CompensationRequest(),
    P.Compensate(b"\x01values", b""),
]


def test_every_message_class_is_covered() -> None:
    covered = {type(m) for m in MESSAGES}
    assert covered == set(P._TYPES.values())
    assert len({cls.CODE for cls in P._TYPES.values()}) == len(P._TYPES)


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(msg: P.Message) -> None:
    frame = P.encode(msg)
    assert isinstance(frame, bytes)
    back = P.decode(frame)
    assert type(back) is type(msg)
    for f in dataclasses.fields(msg):
        assert getattr(back, f.name) == tuples(getattr(msg, f.name)), f.name
    # Decoding its own encoding is stable.
    assert P.decode(P.encode(back)) == back


def test_messages_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        P.Complete(1).checkpoint_id = 2  # type: ignore[misc]


def test_unknown_code() -> None:
    with pytest.raises(ValueError, match="unknown control message code 99"):
        P.decode(msgpack.packb([99, 1]))


@pytest.mark.parametrize(
    ("code", "fields", "error"),
    [
        (22, [3, "SOMETHING_NEW"], "Abort.reason: 'SOMETHING_NEW' is no CheckpointFailureReason"),
        (4, [1, 0, 9, "declined", "x"], "Decline.reason: 'declined' is no CheckpointFailureReason"),
        (8, [5, 0, "OOPS", "map", 1, "E", "", False], "Failed.cause: 'OOPS' is no TaskFailure"),
        (3, [2, 1, 7, {"size": 1}, {}], "Ack.state: task state handle .* is malformed"),
        (3, [2, 1, 7, None, {"keys": "many"}], "Ack.metrics: AckMetrics.keys: 'many' is not"),
        (7, [5, 0], "Finished: .*missing 1 required positional argument"),
        (21, [1, 2], "Complete: .*takes 2 positional arguments but 3"),
    ],
)
def test_what_does_not_fit_is_an_error(code: int, fields: list[Any], error: str) -> None:
    """An unknown name or a malformed record is refused, naming the message and the
    field, never mapped to a default."""
    with pytest.raises(ValueError, match=error):
        P.decode(msgpack.packb([code, *fields]))


def test_abort_reasons_have_distinct_messages() -> None:
    messages = [reason.message for reason in R]
    assert len(set(messages)) == len(messages)
    assert all(message for message in messages)
