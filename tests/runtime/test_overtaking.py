"""The input side of unaligned checkpoints: barriers act when read, queued frames are
channel state, a recording checkpoint drains the gate (real `UnalignedHandler`, fake
gates and a checkpointer that logs like the real one; no sockets)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from channels.messages import (
    Barrier,
    CancelBarrier,
    EndOfInput,
    Event,
    decode_header,
    decode_records,
    encode_data,
    encode_event,
)
from runtime.barriers import UnalignedHandler
from runtime.control import CheckpointFailureReason
from runtime.overtaking import QUEUE_FRAMES, OvertakingInput
from tests.runtime.test_task import FakeGate


class Checkpointer:
    """CheckpointActions the way `TaskCheckpointer` does them for channel state: a log
    opens at the snapshot (and the queued frames are logged into it), closes complete."""

    def __init__(self) -> None:
        self.overtaking: OvertakingInput | None = None
        self.open: tuple[int, list[Any]] | None = None
        self.snapshots: list[int] = []
        self.complete: dict[int, list[Any]] = {}
        self.aborted: list[int] = []

    def trigger_checkpoint(self, barrier: Barrier, alignment_started_at: float) -> None:
        self.snapshots.append(barrier.checkpoint_id)
        self.open = (barrier.checkpoint_id, [])
        assert self.overtaking is not None
        self.overtaking.log_queued()

    def log(self, frame: bytes, records: int) -> None:
        assert self.open is not None, "a frame logged with no log open"
        assert records == len(decode_records(frame))
        self.open[1].extend(decode_records(frame))

    def channel_state_logged(self, checkpoint_id: int) -> None:
        assert self.open is not None and self.open[0] == checkpoint_id
        self.complete[checkpoint_id] = self.open[1]
        self.open = None

    def abort_checkpoint(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        self.aborted.append(checkpoint_id)
        self.open = None

    def block(self, channel: int) -> None:
        raise AssertionError("unaligned checkpoints block nothing")

    def unblock_all(self) -> None:
        pass

    def end_of_all_inputs(self) -> None:
        pass

    def back_edges_logged(self, checkpoint_id: int) -> None:
        raise AssertionError("no back-edges here")


class Rig:
    def __init__(self, tmp_path: Path, channels: tuple[int, ...] = (0, 1)) -> None:
        self.gate, self.priority = FakeGate(), FakeGate()
        self.cp = Checkpointer()
        self.handler = UnalignedHandler(channels, self.cp)
        self.processed: list[tuple[int, Any]] = []
        self.input = OvertakingInput(
            self.gate,
            self.priority,
            self.handler,
            self.cp.log,
            self._deliver,
            lambda: str(tmp_path),
            1 << 20,
        )
        self.cp.overtaking = self.input

    def _deliver(self, frame: bytes) -> None:
        channel, kind = decode_header(frame)
        self.processed.append((channel, decode_records(frame) if kind == 0 else "event"))

    def data(self, channel: int, *records: int) -> None:
        self.gate.frames.append(encode_data(channel, list(records)))

    def event(self, channel: int, event: Event) -> None:
        self.gate.frames.append(encode_event(channel, event))

    def overtake(self, channel: int, n: int) -> None:
        self.priority.frames.append(encode_event(channel, Barrier(n, 0.0)))

    def processed_records(self) -> list[int]:
        return [r for _c, batch in self.processed if batch != "event" for r in batch]


def test_an_overtaking_barrier_logs_what_is_queued_and_what_is_in_flight(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.data(0, 1, 2)
    rig.input.read()
    rig.input.process()  # processed before the snapshot
    rig.data(1, 3)
    rig.input.read()  # queued, not processed
    rig.data(0, 4)
    rig.event(0, Barrier(1, 0.0))  # 0's in-flight records end here
    rig.data(0, 5)  # after 0's barrier: not channel state
    rig.data(1, 6)
    rig.overtake(1, 1)
    rig.input.read()
    assert rig.cp.snapshots == [1] and rig.cp.open is not None
    assert sorted(rig.cp.open[1]) == [3, 4, 6]  # queued, then read before the barriers
    rig.event(1, Barrier(1, 0.0))
    rig.data(1, 7)
    rig.input.read()
    assert sorted(rig.cp.complete[1]) == [3, 4, 6]
    while rig.input.process():
        pass
    assert rig.processed_records() == [1, 2, 3, 4, 5, 6, 7]  # every record once, in order


def test_an_in_band_barrier_read_first_snapshots_before_its_channel_is_processed(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)
    rig.data(0, 1)
    rig.data(1, 2)
    rig.event(0, Barrier(3, 0.0))
    rig.data(0, 9)
    rig.event(1, Barrier(3, 0.0))
    rig.input.read()
    assert rig.processed == [] and rig.cp.complete == {3: [1, 2]}
    while rig.input.process():
        pass
    assert rig.processed_records() == [1, 2, 9]


def test_backpressure_reaches_the_upstream_unless_a_checkpoint_records(tmp_path: Path) -> None:
    rig = Rig(tmp_path, channels=(0,))
    for i in range(3 * QUEUE_FRAMES):
        rig.data(0, i)
    rig.input.read()
    assert len(rig.input) == QUEUE_FRAMES  # the rest waits in the gate
    assert rig.input.process() == QUEUE_FRAMES
    rig.overtake(0, 1)
    rig.event(0, Barrier(1, 0.0))
    rig.input.read()  # recording: everything is read, the channel state completes
    assert len(rig.gate.frames) == 0 and rig.cp.complete[1] == list(range(64, 192))
    assert rig.input.process() == QUEUE_FRAMES and rig.input.process() == QUEUE_FRAMES
    assert rig.processed_records() == list(range(3 * QUEUE_FRAMES))


def test_while_recording_one_frame_is_processed_per_turn(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.overtake(0, 1)
    for i in range(5):
        rig.data(1, i)
    rig.input.read()
    assert rig.cp.open is not None and rig.input.process() == 1


def test_end_of_input_and_final_barriers_keep_their_place(tmp_path: Path) -> None:
    rig = Rig(tmp_path, channels=(0,))
    rig.data(0, 1)
    rig.event(0, Barrier(7, 0.0, final=True))
    rig.event(0, EndOfInput())
    rig.input.read()
    assert rig.cp.snapshots == [] and len(rig.input) == 3
    while rig.input.process():
        pass
    assert rig.processed == [(0, [1]), (0, "event"), (0, "event")]


def test_a_newer_barrier_subsumes_and_logs_what_is_still_queued(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.overtake(0, 1)
    rig.data(1, 1)
    rig.input.read()
    rig.overtake(1, 2)
    rig.input.read()
    assert rig.cp.aborted == [1] and rig.cp.open == (2, [1])  # still queued: state of 2 too


def test_the_queue_spills_past_its_threshold(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    small = OvertakingInput(
        rig.gate,
        rig.priority,
        rig.handler,
        rig.cp.log,
        lambda frame: None,
        lambda: str(tmp_path),
        64,
    )
    for i in range(10):
        rig.data(0, *range(i * 100, i * 100 + 100))
    small.read()
    assert small.spilled_bytes > 0 and len(small) == 10
    small.close()
    assert list(tmp_path.iterdir()) == []


def test_a_cancel_of_the_recording_checkpoint_acts_when_read(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.overtake(0, 1)
    rig.event(1, CancelBarrier(1))  # declined upstream: no barrier(1) will come on 1
    rig.event(1, CancelBarrier(0))  # not the recording one: keeps its place
    rig.input.read()
    assert rig.cp.aborted == [1] and not rig.input.recording and len(rig.input) == 1
