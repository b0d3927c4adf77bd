"""The task loop, its blocked channels and its checkpointer, on fakes: no Spark, no ZeroMQ.

The fakes: a gate that hands out scripted frames, output channels that log what they
are sent, and a control socket that plays the job manager (it completes every
checkpoint it is acked, and says Alive to heartbeats).
"""

from __future__ import annotations

import dataclasses
import logging
import zlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any

import pytest

from channels.messages import (
    Barrier,
    CancelBarrier,
    EndOfInput,
    Event,
    encode_data,
    encode_event,
)
from runtime import control as P
from runtime.api.dataflow import Dataflow
from runtime.barriers import BarrierAligner, BarrierProtocolError
from runtime.chain import Capture
from runtime.checkpointer import TaskCheckpointer, TaskIdentity
from runtime.config import JobConfig
from runtime.control import CheckpointFailureReason
from runtime.errors import CheckpointStorageError, RecordSerializationError, TaskCancelled
from runtime.inputs import BlockedChannels
from runtime.plan import JobPlan
from runtime.sources import CollectionSource
from runtime.task import Task
from runtime.task_environment import TaskEnvironment
from runtime.task_faults import TaskFaults
from statebackend.errors import IncompatibleCheckpointError
from statebackend.metadata import CheckpointMetadata, OperatorLayout, TaskStateHandle
from statebackend.metrics import AckMetrics, CheckpointSummary
from statebackend.snapshot import OperatorSnapshot
from statebackend.storage import CheckpointStorage

Log = list[tuple[str, Any]]


# -- fakes -------------------------------------------------------------------------------
class FakeOutput:
    def __init__(self, name: str, log: Log) -> None:
        self.name, self.log = name, log
        self.closed = False
        self.bytes_sent, self.blocked_seconds, self.pending_count = 0, 0.0, 0

    def write(self, records: list[Any]) -> None:
        self.log.append(("write", list(records)))

    def flush(self) -> None:
        pass

    def flush_if_older(self, now: float, timeout: float) -> None:
        pass

    def send_event(self, event: Event) -> None:
        self.log.append(("forward", event))

    def send_priority(self, event: Event) -> bool:
        self.log.append(("priority", event))
        return True

    def close(self, linger_ms: int = 0) -> None:
        self.closed = True


class FakeGate:
    endpoint = "fake://gate"

    def __init__(self) -> None:
        self.frames: deque[bytes] = deque()

    def recv_frames(self, max_frames: int) -> list[bytes]:
        out: list[bytes] = []
        while self.frames and len(out) < max_frames:
            out.append(self.frames.popleft())
        return out


class FakeJobManager:
    """The task's control socket, answering like the job manager would."""

    def __init__(self) -> None:
        self.inbox: deque[bytes] = deque()
        self.received: list[P.Message] = []
        self.closed = False

    def tell(self, msg: P.Message) -> None:
        self.inbox.append(P.encode(msg))

    def send(self, data: bytes, /) -> None:
        msg = P.decode(data)
        self.received.append(msg)
        if isinstance(msg, P.Ack):
            self.tell(P.Complete(msg.checkpoint_id))
        elif isinstance(msg, P.Heartbeat):
            self.tell(P.Alive())

    def recv(self) -> bytes:
        return self.inbox.popleft()

    def poll(self, timeout: int, /) -> int:
        return len(self.inbox)

    def close(self, linger: int | None = None) -> None:
        self.closed = True

    def of_type(self, cls: type) -> list[Any]:
        return [m for m in self.received if isinstance(m, cls)]


class FakeIO:
    def __init__(self, feedback: bool = False, priority: bool = False) -> None:
        self.gate = FakeGate()
        self.feedback_gate: FakeGate | None = FakeGate() if feedback else None
        self.priority_gate: FakeGate | None = FakeGate() if priority else None
        self.jm = FakeJobManager()
        self.log: Log = []
        self.outputs: dict[int, FakeOutput] = {}

    def control_socket(self) -> FakeJobManager:
        return self.jm

    def output(
        self,
        channel_id: int,
        target_task: int,
        on_backpressure: Callable[[], None],
        back_edge: bool = False,
    ) -> FakeOutput:
        self.outputs[channel_id] = FakeOutput(f"ch{channel_id}", self.log)
        return self.outputs[channel_id]

    refused_connections = 0  # no socket to refuse anyone

    def wait(self, timeout_ms: int) -> tuple[bool, bool]:
        side = [g for g in (self.feedback_gate, self.priority_gate) if g is not None]
        return bool(self.gate.frames) or any(g.frames for g in side), bool(self.jm.inbox)


def double(x: int) -> int:
    return 2 * x


def parity(x: int) -> int:
    return x % 2


def merge_plan(**kw: Any) -> JobPlan:
    """Two sources into union "merge" -> map "double" (one task, two input channels 0
    and 1) -> hash -> reduce "count" -> collect."""
    flow = Dataflow("merge", parallelism=1)
    a = flow.source(CollectionSource([1]), name="a")
    b = flow.source(CollectionSource([2]), name="b")
    (
        a.union(b, name="merge")
        .map(kw.get("fn", double), name="double")
        .key_by(parity)
        .reduce(lambda x, _y: x, name="count")
        .collect("out")
    )
    return flow.plan()


def merge_task(tmp_path: Path, **settings: Any) -> tuple[Task, FakeIO]:
    plan = merge_plan(**settings.pop("plan", {}))
    spec = next(t for t in plan.tasks if t.task_id == "merge[0]")
    assert spec.inputs == [0, 1]
    env = TaskEnvironment(
        jm_endpoint="fake://jm",
        attempt=0,
        config=JobConfig(heartbeat_interval=3600, **settings),
        checkpoint_root=str(tmp_path / "chk") if settings.get("checkpoint_interval") else None,
        restore_root=None,
        restore_metadata=None,
        run_id="test",
    )
    io = FakeIO(priority=env.config.barriers_overtake)
    return Task(plan, spec, env, io, "127.0.0.1"), io


def data(channel: int, *records: Any) -> bytes:
    return encode_data(channel, list(records))


def event(channel: int, e: Event) -> bytes:
    return encode_event(channel, e)


# -- the task loop -----------------------------------------------------------------------
def test_constructing_a_task_does_no_io(tmp_path: Path) -> None:
    task, io = merge_task(tmp_path)
    assert io.outputs == {} and io.jm.received == []
    task.close(graceful=False)  # safe without open()


def test_blocked_frames_are_replayed_in_order_before_newer_ones(tmp_path: Path) -> None:
    task, io = merge_task(tmp_path)
    task.open()
    assert [type(m) for m in io.jm.received] == [P.Register]
    b1, b2 = Barrier(1, 0.0), Barrier(2, 0.0, final=True)
    io.gate.frames.extend(
        [
            data(0, 1, 2),
            event(0, b1),  # blocks channel 0
            data(0, 3),  # buffered
            data(1, 10),
            event(1, b1),  # aligned: checkpoint 1, unblock
            data(0, 4),  # newer than the buffered [3]
            event(0, b2),
            event(1, b2),
            event(0, EndOfInput()),
            event(1, EndOfInput()),
        ]
    )
    task.run()
    assert io.log == [
        ("write", [2, 4]),
        ("write", [20]),
        ("forward", b1),
        ("write", [6]),
        ("write", [8]),
        ("forward", b2),
        ("forward", EndOfInput()),
    ]
    acks = io.jm.of_type(P.Ack)
    assert [a.checkpoint_id for a in acks] == [1, 2]
    assert acks[0].state is None  # no checkpoint storage
    assert isinstance(acks[0].metrics, AckMetrics)
    finished = io.jm.of_type(P.Finished)[0].metrics
    assert finished.records_in == 5 and finished.uptime_seconds > 0
    assert finished.bytes_in > 0  # counted per frame received
    task.close(graceful=True)
    assert io.jm.closed and all(o.closed for o in io.outputs.values())
    assert isinstance(io.jm.received[-1], P.Closed)


def test_unaligned_barriers_overtake_queued_input_which_becomes_channel_state(
    tmp_path: Path,
) -> None:
    task, io = merge_task(tmp_path, snapshot_mode="unaligned")
    task.open()
    b1, b2 = Barrier(1, 0.0), Barrier(2, 0.0, final=True)
    io.gate.frames.extend(
        [data(0, 1, 2), data(1, 10), event(0, b1), data(0, 3), event(1, b1), data(1, 11)]
        + [event(c, e) for e in (b2, EndOfInput()) for c in (0, 1)]
    )
    assert io.priority_gate is not None
    io.priority_gate.frames.append(event(1, b1))  # ahead of everything queued
    task.run()
    # The snapshot came first (priority, then in band on every output), the records after.
    assert io.log[:2] == [("priority", b1), ("forward", b1)]
    assert [r for kind, part in io.log if kind == "write" for r in part] == [2, 4, 20, 6, 22]
    ack = io.jm.of_type(P.Ack)[0]
    assert ack.checkpoint_id == 1 and ack.metrics.channel_state_records == 3  # 1, 2, 10
    assert ack.metrics.records_in == 0
    task.close(graceful=True)


def _final_ack_handle(tmp_path: Path, **settings: Any) -> tuple[P.Ack, TaskStateHandle]:
    task, io = merge_task(tmp_path, checkpoint_interval=1.0, **settings)
    task.open()
    b = Barrier(1, 0.0, final=True)
    io.gate.frames.extend(
        [event(0, b), event(1, b), event(0, EndOfInput()), event(1, EndOfInput())]
    )
    task.run()
    (ack,) = io.jm.of_type(P.Ack)
    task.close(graceful=True)
    assert ack.state is not None
    return ack, ack.state


def test_state_files_are_written_through_the_storage(tmp_path: Path) -> None:
    ack, handle = _final_ack_handle(tmp_path, state_inline_threshold=0)
    assert handle.file == "merge[0].state" and handle.operators == {}  # nothing stateful
    assert handle.inline is None
    assert (tmp_path / "chk" / "chk-1" / "merge[0].state").stat().st_size == handle.size
    assert ack.metrics.state_bytes == handle.size


def test_a_small_state_travels_inline_in_the_ack(tmp_path: Path) -> None:
    ack, handle = _final_ack_handle(tmp_path)  # the default threshold, 20 KiB
    assert handle.file == "" and handle.inline is not None
    assert len(handle.inline) == handle.size == ack.metrics.state_bytes
    assert zlib.crc32(handle.inline) == handle.crc32
    assert not (tmp_path / "chk" / "chk-1" / "merge[0].state").exists()


def test_an_abort_from_the_job_manager_reaches_the_handler_with_its_reason(
    tmp_path: Path,
) -> None:
    task, io = merge_task(tmp_path)
    task.open()
    io.gate.frames.extend([event(0, Barrier(1, 0.0)), data(0, 5)])
    task.turn()
    assert task.inputs is not None and task.inputs.buffered(0) == 1  # aligning, 0 blocked
    io.jm.tell(P.Abort(1, CheckpointFailureReason.EXPIRED))
    task.turn()
    (decline,) = io.jm.of_type(P.Decline)
    assert (decline.checkpoint_id, decline.reason) == (1, CheckpointFailureReason.EXPIRED)
    assert decline.detail == CheckpointFailureReason.EXPIRED.message
    assert ("forward", CancelBarrier(1)) in io.log
    task.turn()  # channel 0 is unblocked: its buffered batch is replayed
    assert io.log[-1] == ("write", [10])
    task.close(graceful=False)


def test_a_cancel_from_the_job_manager_ends_the_task(tmp_path: Path) -> None:
    task, io = merge_task(tmp_path)
    task.open()
    io.jm.tell(P.Cancel("the attempt failed"))
    with pytest.raises(TaskCancelled, match="the attempt failed"):
        task.run()
    task.close(graceful=False)


def make_set(x: int) -> Any:
    return {x}


def test_an_unserializable_record_is_a_fatal_failure_naming_its_step(tmp_path: Path) -> None:
    task, io = merge_task(tmp_path, plan={"fn": make_set})

    def refuse(records: list[Any]) -> None:  # what OutputChannel.write raises
        raise RecordSerializationError.of_batch(records, TypeError("can not serialize 'set'"))

    task.open()
    for output in io.outputs.values():
        output.write = refuse  # type: ignore[method-assign]
    io.gate.frames.append(data(0, 1))
    with pytest.raises(TaskCancelled):
        task.run()
    (failed,) = io.jm.of_type(P.Failed)
    assert failed.fatal and failed.operator == "double"
    assert failed.cause is P.TaskFailureCause.USER_FUNCTION_RAISED
    assert "step 'double' emitted a record that cannot cross tasks" in failed.error
    assert "convert the set to a list/tuple" in failed.error
    task.close(graceful=False)


# -- blocked channels ----------------------------------------------------------------------
# -- the checkpointer ------------------------------------------------------------------------
class Synchronous(Executor):
    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as err:
            future.set_exception(err)
        return future


class FakeChain:
    def __init__(self, log: Log) -> None:
        self.log = log

    def capture(
        self, checkpoint_id: int, storage: CheckpointStorage | None, final: bool = False
    ) -> Capture:
        self.log.append(("capture", checkpoint_id))
        snap = OperatorSnapshot(b"\x01", None, None)
        return Capture({"op": snap}, {"op": OperatorLayout(0, 1)}, keys=3)

    def finish(self) -> None:
        self.log.append(("finish", None))

    def notify_complete(self, checkpoint_id: int) -> None:
        self.log.append(("complete", checkpoint_id))


class FakeStorage:
    root = "s3://bucket/chk"

    def __init__(
        self, log: Log, fail: bool = False, probe_fails: bool = False, removed: bool = False
    ) -> None:
        self.log, self.fail, self.probe_fails, self.removed = log, fail, probe_fails, removed

    def checkpoint_ids(self) -> list[int]:
        return [] if self.removed else [4]

    def write_task_state(
        self, checkpoint_id: int, task_id: str, snapshots: Any, layout: Any
    ) -> TaskStateHandle:
        self.log.append(("write", checkpoint_id))
        if self.removed:
            raise FileNotFoundError(2, "No such file or directory", f"chk-{checkpoint_id}")
        if self.fail:
            raise OSError(28, "No space left on device")
        return TaskStateHandle(f"{task_id}.state", 42, 7, dict(layout))

    def inline_handle(self, snapshots: Any, layout: Any) -> TaskStateHandle | None:
        return None  # like state_inline_threshold=0: every state is a file

    def probe(self) -> None:
        self.log.append(("probe", None))
        if self.probe_fails:
            raise OSError(28, "No space left on device")


def checkpointer(
    log: Log,
    storage: Any,
    inputs: BlockedChannels | None = None,
    synchronous: bool = False,
    writer: Executor | None = None,
) -> TaskCheckpointer:
    def send(msg: P.Message) -> None:
        log.append((type(msg).__name__.lower(), msg))

    return TaskCheckpointer(
        TaskIdentity(2, 0, "merge[0]", "10.0.0.7"),
        FakeChain(log),
        [FakeOutput("out", log)],
        storage,
        send,
        inputs,
        TaskFaults((), 2, 0),
        writer=writer or Synchronous(),
        synchronous=synchronous,
    )


class Held(Executor):
    """A writer thread that runs nothing until ``run()``; ``submitted`` counts its jobs."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Future[Any], Callable[[], Any]]] = []
        self.submitted = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self.jobs.append((future, lambda: fn(*args, **kwargs)))
        self.submitted += 1
        return future

    def run(self) -> None:
        for future, job in self.jobs:
            future.set_result(job())
        self.jobs.clear()


def test_a_small_state_is_acked_in_the_barriers_own_step_without_the_writer(
    tmp_path: Path,
) -> None:
    # Not after the writer thread gets the GIL and the task loop its next turn (up to 64
    # frames later): the job manager hears of it as soon as the barrier is forwarded.
    log: Log = []
    writer = Held()
    storage = CheckpointStorage(str(tmp_path), inline_threshold=20 * 1024)
    cp = checkpointer(log, storage, writer=writer)
    cp.trigger_source(P.Trigger(3, 0.0, False))
    assert [kind for kind, _ in log] == ["capture", "forward", "ack"]
    assert writer.submitted == 0 and not cp.writes_pending
    handle = log[-1][1].state
    assert handle.inline is not None and handle.size == log[-1][1].metrics.state_bytes
    assert storage.read_operator_state(3, handle, "op") == b"\x01"


def test_a_state_over_the_threshold_goes_to_the_writer(tmp_path: Path) -> None:
    log: Log = []
    writer = Held()
    storage = CheckpointStorage(str(tmp_path), inline_threshold=0)
    cp = checkpointer(log, storage, writer=writer)
    cp.trigger_source(P.Trigger(3, 0.0, False))
    assert [kind for kind, _ in log] == ["capture", "forward"] and writer.submitted == 1
    writer.run()
    cp.collect_writes()
    assert log[-1][0] == "ack" and log[-1][1].state.file


def test_a_small_state_waits_behind_an_older_write_so_acks_stay_in_order(tmp_path: Path) -> None:
    log: Log = []
    writer = Held()
    storage = CheckpointStorage(str(tmp_path), inline_threshold=0)
    cp = checkpointer(log, storage, writer=writer)
    cp.trigger_source(P.Trigger(3, 0.0, False))  # a file: still being written
    storage.inline_threshold = 20 * 1024
    cp.trigger_source(P.Trigger(4, 0.0, False))  # would fit inline, but 3 is not acked yet
    assert writer.submitted == 2 and not [kind for kind, _ in log if kind == "ack"]
    writer.run()
    cp.collect_writes()
    acks = [msg for kind, msg in log if kind == "ack"]
    assert [a.checkpoint_id for a in acks] == [3, 4]
    assert acks[1].state.inline is not None


def test_a_barrier_sequence_captures_forwards_writes_and_acks_in_order(tmp_path: Path) -> None:
    log: Log = []
    inputs = BlockedChannels(
        lambda *a: None, lambda: aligner.blocked_channels, lambda: str(tmp_path), 1 << 20
    )
    cp = checkpointer(log, FakeStorage(log), inputs)
    aligner = BarrierAligner([0, 1], cp)
    barrier = Barrier(1, 0.0)
    aligner.on_barrier(0, barrier)
    assert log == [] and inputs.buffered(0) == 0  # channel 0 blocked, not aligned yet
    inputs.on_frame(data(0, 1))
    assert inputs.buffered(0) == 1
    aligner.on_barrier(1, barrier)
    cp.collect_writes()
    assert [kind for kind, _ in log] == ["capture", "forward", "write", "ack"]
    ack = log[-1][1]
    assert ack.state == TaskStateHandle("merge[0].state", 42, 7, {"op": OperatorLayout(0, 1)})
    assert ack.metrics.keys == 3 and ack.metrics.state_bytes == 42


def test_a_failed_state_write_after_a_good_one_declines_the_checkpoint() -> None:
    log: Log = []
    storage = FakeStorage(log)
    cp = checkpointer(log, storage)
    cp.trigger_source(P.Trigger(3, 0.0, False))
    cp.collect_writes(wait=True)
    storage.fail = True  # e.g. the disk filled up: tolerable, the job goes on
    cp.trigger_source(P.Trigger(4, 0.0, False))
    cp.collect_writes(wait=True)
    assert [kind for kind, _ in log][-4:] == ["capture", "forward", "write", "decline"]
    decline = log[-1][1]
    assert decline.checkpoint_id == 4
    assert decline.reason == CheckpointFailureReason.STATE_WRITE_FAILED
    assert "No space left" in decline.detail


def test_a_write_of_an_aborted_checkpoint_is_neither_acked_nor_declined() -> None:
    # The job manager removes an aborted checkpoint's files; a write still in flight
    # then fails (or lands in a removed dir): nothing to report about it.
    log: Log = []
    cp = checkpointer(log, FakeStorage(log, fail=True))
    cp.trigger_source(P.Trigger(4, 0.0, False))
    cp.trigger_source(P.Trigger(5, 0.0, False))
    cp.aborted(4)
    cp.aborted(9)  # not pending here: ignored
    cp.collect_writes(wait=True)
    sent = [(kind, m.checkpoint_id) for kind, m in log if kind in ("ack", "decline")]
    assert sent == [("decline", 5)]
    assert not cp.writes_pending


def test_synchronous_snapshots_write_before_going_on_and_halt_a_source() -> None:
    log: Log = []
    cp = checkpointer(log, FakeStorage(log), synchronous=True)
    cp.trigger_source(P.Trigger(3, 0.0, False))
    # Acked without collect_writes: the task did nothing else while writing.
    assert [kind for kind, _ in log] == ["capture", "forward", "write", "ack"]
    assert cp.halted and not cp.writes_pending
    cp.complete(2)
    assert cp.halted  # an older checkpoint's end does not release it
    cp.complete(3)
    assert not cp.halted
    cp.trigger_source(P.Trigger(4, 0.0, False))
    cp.aborted(4)
    assert not cp.halted  # an aborted checkpoint releases the source too
    cp.trigger_source(P.Trigger(5, 0.0, True))
    assert not cp.halted  # the final checkpoint ends the source's output anyway


def test_a_halt_stops_a_source_until_its_checkpoint_ends() -> None:
    log: Log = []
    cp = checkpointer(log, FakeStorage(log), synchronous=True)
    cp.halt(6)
    assert cp.halted and log == []  # halted before any snapshot: the job drains first
    cp.trigger_source(P.Trigger(6, 0.0, False))
    assert cp.halted
    cp.complete(6)
    assert not cp.halted
    aligned = checkpointer(log, FakeStorage(log))
    with pytest.raises(BarrierProtocolError, match="not synchronous"):
        aligned.halt(7)


def test_a_write_into_a_checkpoint_the_job_manager_removed_is_no_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log: Log = []
    cp = checkpointer(log, FakeStorage(log, removed=True))
    with caplog.at_level(logging.DEBUG, logger="absflow.task"):
        cp.trigger_source(P.Trigger(4, 0.0, False))
        cp.collect_writes(wait=True)
    assert [kind for kind, _ in log][-1] == "decline"  # harmless: the job manager dropped it
    assert [r.levelno for r in caplog.records if "writing checkpoint" in r.message] == [
        logging.DEBUG
    ]


def test_a_failed_first_state_write_is_an_error_naming_the_storage_and_the_host() -> None:
    log: Log = []
    cp = checkpointer(log, FakeStorage(log, fail=True, probe_fails=True))
    cp.trigger_source(P.Trigger(1, 0.0, False))
    with pytest.raises(CheckpointStorageError) as info:
        cp.collect_writes(wait=True)
    message = str(info.value)
    assert "merge[0] on host 10.0.0.7" in message and "'s3://bucket/chk'" in message
    assert "No space left" in message and "a restart cannot fix" in message
    assert [kind for kind, _ in log][-2:] == ["write", "probe"]  # no decline: the task fails


def test_a_failed_first_write_is_declined_when_the_storage_takes_a_probe() -> None:
    """E.g. its checkpoint was aborted and removed while the write ran: the storage is fine."""
    log: Log = []
    cp = checkpointer(log, FakeStorage(log, fail=True))
    cp.trigger_source(P.Trigger(1, 0.0, False))
    cp.collect_writes(wait=True)
    assert [kind for kind, _ in log][-3:] == ["write", "probe", "decline"]


def test_without_storage_the_ack_follows_the_forward_at_once() -> None:
    log: Log = []
    cp = checkpointer(log, None)
    cp.trigger_source(P.Trigger(1, 0.0, final=True))
    assert [kind for kind, _ in log] == ["finish", "capture", "forward", "ack", "forward"]
    assert log[-1][1] == EndOfInput()
    assert not cp.completed_final
    cp.complete(1)
    assert cp.completed_final and log[-1] == ("complete", 1)


def test_the_task_process_never_imports_the_job_manager() -> None:
    import subprocess
    import sys

    code = (
        "import sys, runtime.task_entry; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'jobmanager'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_checkpoint_that_does_not_fit_is_a_fatal_task_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Restoring fails before the first record: the task reports its own error (not a
    user function's), fatal, and ends."""
    task, io = merge_task(tmp_path)
    metadata = CheckpointMetadata(
        checkpoint_id=3,
        job="merge",
        attempt=0,
        final=False,
        trigger_time=0.0,
        completed_time=1.0,
        duration_ms=1.0,
        max_parallelism=128,
        tasks={},
        task_metrics={},
        metrics=CheckpointSummary(),
    )
    task.env = dataclasses.replace(task.env, restore_metadata=metadata, restore_root=str(tmp_path))

    def refuse(*args: Any) -> None:
        raise IncompatibleCheckpointError("step 'double' changed its parallelism")

    monkeypatch.setattr("runtime.task.plan_restore", refuse)
    with pytest.raises(TaskCancelled, match=r"restoring checkpoint 3 .* failed"):
        task.open()
    (failed,) = io.jm.of_type(P.Failed)
    assert failed.cause is P.TaskFailureCause.TASK_ERROR and failed.operator == "merge[0]"
    assert failed.fatal and "changed its parallelism" in failed.error
    task.close(graceful=False)
