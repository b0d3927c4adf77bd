"""The blocked channels of a task's input side (runtime/inputs.py): frames of a blocked
channel wait in order (spilling past the threshold) and are replayed before newer ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from channels.messages import KIND_BARRIER, Barrier
from runtime.inputs import BlockedChannels
from tests.runtime.test_task import data, event


def test_blocked_channels_buffer_and_replay_oldest_first(tmp_path: Path) -> None:
    delivered: list[tuple[int, Any]] = []
    blocked: set[int] = set()
    inputs = BlockedChannels(
        lambda ch, kind, frame: delivered.append((ch, frame)),
        lambda: frozenset(blocked),
        lambda: str(tmp_path),
        spill_threshold=10,  # the second frame already spills to disk
    )
    f = [data(0, i) for i in range(4)] + [data(1, 99)]
    blocked.add(0)
    inputs.block(0)
    for frame in f[:3]:
        inputs.on_frame(frame)
    inputs.on_frame(f[4])  # channel 1 is not blocked: delivered at once
    assert delivered == [(1, f[4])] and not inputs.replaying
    assert inputs.spilled_bytes > 0
    blocked.clear()  # the handler unblocked
    assert inputs.replaying
    inputs.on_frame(f[3])  # newer than the buffer: goes behind it
    inputs.replay(budget=2)
    assert delivered[1:] == [(0, f[0]), (0, f[1])]
    inputs.replay()
    assert delivered[1:] == [(0, f[i]) for i in range(4)]
    assert not inputs.replaying and inputs.buffered(0) == 0
    assert inputs.spilled_total > 0 and list(tmp_path.iterdir()) == []


def test_a_replayed_barrier_that_blocks_its_channel_again_stops_its_replay(
    tmp_path: Path,
) -> None:
    delivered: list[tuple[int, int]] = []
    blocked: set[int] = set()

    def dispatch(channel: int, kind: int, frame: bytes) -> None:
        delivered.append((channel, kind))
        if kind == KIND_BARRIER:  # the handler blocks the channel on its barrier
            blocked.add(channel)
            inputs.block(channel)

    inputs = BlockedChannels(dispatch, lambda: frozenset(blocked), lambda: str(tmp_path), 1 << 20)
    blocked.add(0)
    inputs.block(0)
    for frame in (data(0, "a"), event(0, Barrier(2, 0.0)), data(0, "b"), data(0, "c")):
        inputs.on_frame(frame)
    blocked.clear()
    inputs.replay()
    assert delivered == [(0, 0), (0, KIND_BARRIER)]
    assert inputs.buffered(0) == 2 and inputs.buffered_total == 2 and not inputs.replaying
    blocked.clear()
    inputs.replay()
    assert delivered[2:] == [(0, 0), (0, 0)] and inputs.buffered(0) == 0
    inputs.close()


def test_close_drops_every_buffer_and_its_spill_file(tmp_path: Path) -> None:
    got: list[Any] = []
    inputs = BlockedChannels(lambda *a: got.append(a), frozenset, lambda: str(tmp_path), 10)
    for channel in (0, 1):
        inputs.block(channel)
        for i in range(3):
            inputs.on_frame(data(channel, i))
    assert inputs.buffered_total == 6 and any(tmp_path.iterdir())
    inputs.close()
    assert inputs.buffered_total == 0 and not any(tmp_path.iterdir()) and got == []
