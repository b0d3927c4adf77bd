"""The task: one chain of operators in one long-lived process, and its loop.

A task reads batches from its input gate (one PULL socket shared by all its
input channels), pushes each batch through its chain, and writes the result to
its output channels. Barriers, end-of-input and cancel markers arrive in band;
the barrier handler (``runtime.barriers``) decides when to block a channel and
when to snapshot. Control messages (trigger, complete, abort, cancel) arrive on
a DEALER socket from the job manager.

Threading: everything here runs on the task-loop thread, except the
asynchronous part of a snapshot (compress + write + fsync), which runs in one
background thread and touches only the immutable snapshot blobs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
import traceback
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import msgpack
import zmq

from channels import control as P
from channels.messages import (
    HEADER,
    KIND_BARRIER,
    KIND_CANCEL,
    KIND_DATA,
    KIND_END_OF_INPUT,
    Barrier,
    CancelBarrier,
    EndOfInput,
    decode_event,
    decode_records,
)
from channels.partitioners import (
    BroadcastPartitioner,
    ForwardPartitioner,
    HashPartitioner,
    RebalancePartitioner,
)
from channels.zmq_io import InputGate, OutputChannel
from runtime.barriers import BarrierAligner, BarrierTracker
from runtime.config import SnapshotMode, TaskEnvironment
from runtime.graph import Partitioning, StepKind
from runtime.operators import Operator, build_operator
from runtime.plan import JobPlan, TaskSpec
from runtime.sinks import SinkContext
from statebackend.snapshot import (
    OperatorSnapshot,
    read_keyed_state,
    read_operator_state,
    write_task_snapshot,
)
from statebackend.spill import SpillBuffer

log = logging.getLogger("absflow.task")

_HEADER_UNPACK = HEADER.unpack_from
_KIND_MASK = 0x0F


class TaskCancelled(Exception):
    """The job manager told this task to stop (or went silent)."""


class OperatorFailure(Exception):
    """A user function raised; carries the operator name."""

    def __init__(self, operator: str, cause: BaseException) -> None:
        super().__init__(f"{operator}: {type(cause).__name__}: {cause}")
        self.operator = operator
        self.cause = cause


class _RaiseAtRecord(Operator):
    """Fault injection: raises once the wrapped operator has seen ``record`` records."""

    def __init__(self, inner: Operator, record: int) -> None:
        super().__init__(inner.step)
        self.inner, self.limit, self.seen = inner, record, 0
        self.keyed_state = inner.keyed_state

    def process(self, batch: list[Any]) -> list[Any]:
        if self.seen + len(batch) >= self.limit:
            raise RuntimeError(f"injected failure at record {self.limit} of '{self.name}'")
        self.seen += len(batch)
        return self.inner.process(batch)

    def __getattr__(self, item: str) -> Any:
        return getattr(self.inner, item)


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class Task:
    """Runs one subtask of one chain until the job ends or the task is cancelled."""

    def __init__(
        self,
        plan: JobPlan,
        spec: TaskSpec,
        env: TaskEnvironment,
        zctx: zmq.Context[Any],
        gate: InputGate | None,
        endpoints: dict[int, str],
        host: str,
    ) -> None:
        self.plan, self.spec, self.env = plan, spec, env
        self.config = env.config
        self.zctx, self.gate = zctx, gate
        self.index, self.attempt, self.task_id = spec.index, env.attempt, spec.task_id
        steps = plan.chain_steps(spec)
        self.is_source = steps[0].kind is StepKind.SOURCE
        self.tmpdir = tempfile.mkdtemp(prefix=f"absflow-{spec.index}-", dir=env.tmp_root)

        self.control = zctx.socket(zmq.DEALER)
        self.control.setsockopt(zmq.LINGER, 2000)
        self.control.setsockopt(zmq.IDENTITY, f"{spec.index}:{env.attempt}".encode())
        self.control.connect(env.jm_endpoint)
        self.queued_control: deque[P.Message] = deque()
        self.last_jm_contact = time.monotonic()

        cfg = self.config
        self.outputs: list[tuple[Any, list[OutputChannel]]] = []
        self.all_channels: list[OutputChannel] = []
        for out in spec.outputs:
            chans = []
            for ch in out.channels:
                target = plan.channels[ch].target_task
                oc = OutputChannel(
                    zctx,
                    endpoints[target],
                    ch,
                    batch_size=cfg.batch_size,
                    sndhwm=cfg.channel_hwm,
                    compress_min_bytes=cfg.compress_min_bytes,
                    on_backpressure=self._on_backpressure,
                )
                chans.append(oc)
                self.all_channels.append(oc)
            self.outputs.append(
                (self._partitioner(out.partitioning, out.key_fn, len(chans)), chans)
            )

        # Operators of the chain (a source step is read by the loop, not an operator).
        self.reader = (
            steps[0].fn.create_reader(spec.subtask, steps[0].parallelism)
            if self.is_source
            else None
        )
        self.source_step = steps[0] if self.is_source else None
        self.operators: list[Operator] = []
        for step in steps[1:] if self.is_source else steps:
            ctx = None
            if step.kind is StepKind.SINK:
                ctx = SinkContext(
                    step.name,
                    spec.subtask,
                    step.parallelism,
                    env.attempt,
                    self._sink_sender(step.name),
                )
            op = build_operator(step, spec.subtask, plan.max_parallelism, ctx)
            for fault in env.faults:
                if (
                    fault.kind == "raise_at_record"
                    and fault.operator == step.name
                    and fault.task_index == spec.index
                    and fault.attempt == env.attempt
                ):
                    op = _RaiseAtRecord(op, fault.record or 0)
            self.operators.append(op)
        self.processes: list[Callable[[list[Any]], list[Any]]] = [
            op.process for op in self.operators
        ]
        tail = steps[-1]
        self.sink_position = len(self.operators) - 1 if tail.kind is StepKind.SINK else -1

        # Barrier handling.
        mode = cfg.snapshot_mode
        handler_cls = BarrierAligner if mode is SnapshotMode.EXACTLY_ONCE else BarrierTracker
        self.barriers = handler_cls(spec.inputs, self) if spec.inputs else None
        self.buffers: dict[int, SpillBuffer] = {}  # blocked or still replaying channels
        self.blocked: set[int] = set()
        self.first_barrier_at: dict[int, float] = {}

        # Checkpoint bookkeeping.
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="absflow-snapshot")
        self.pending_writes: list[tuple[int, Future[Any], dict[str, Any]]] = []
        self.final_checkpoint: int | None = None
        self.completed_final = False
        self.inputs_ended = False
        self.source_ended = False

        # Metrics.
        self.records_in = 0
        self.records_out = 0
        self.first_record_at = 0.0
        self.peak_rss = _rss_bytes()
        self.next_heartbeat = 0.0
        self.spilled_total = 0

        self._send(
            P.Register(
                spec.index,
                env.attempt,
                spec.task_id,
                os.getpid(),
                host,
                gate.endpoint if gate else "",
            )
        )
        try:
            restored = self._restore() if env.restore_dir is not None else {}
        except Exception as err:  # the checkpoint does not fit: restarting cannot help
            self._report_failure(self.task_id, err, fatal=True)
            raise TaskCancelled(f"restoring {env.restore_dir} failed: {err}") from err
        for op in self.operators:
            if op.step.kind is StepKind.SINK or restored.get(op.name) is not None:
                op.restore_state(restored.get(op.name))

    # -- set-up ------------------------------------------------------------------------
    def _partitioner(self, partitioning: Partitioning, key_fn: Any, n: int) -> Any:
        if partitioning is Partitioning.FORWARD:
            return ForwardPartitioner(0)
        if partitioning is Partitioning.HASH:
            return HashPartitioner(key_fn, n, self.plan.max_parallelism)
        if partitioning is Partitioning.REBALANCE:
            return RebalancePartitioner(n, start=self.spec.subtask % n)
        return BroadcastPartitioner(n)

    def _restore(self) -> dict[str, Any]:
        """Seek the source, load keyed state; return the operators' own states by name."""
        meta = self.env.restore_metadata or {}
        root = self.env.restore_dir
        assert root is not None
        files = meta.get("tasks", {})
        subtask = self.spec.subtask

        def files_with(op_name: str) -> list[tuple[str, dict[str, Any]]]:
            found = []
            for info in files.values():
                op = info.get("operators", {}).get(op_name)
                if op is not None:
                    found.append((os.path.join(root, info["file"]), op))
            return found

        def operator_state(name: str, parallelism: int) -> Any:
            for path, op in files_with(name):
                if op["subtask"] == subtask:
                    blob = read_operator_state(path, name)
                    if blob is None:
                        return None
                    if op["parallelism"] != parallelism:
                        raise RuntimeError(
                            f"cannot restore '{name}' at parallelism {parallelism}: the checkpoint "
                            f"has it at parallelism {op['parallelism']} and its state is not keyed; "
                            f"run '{name}' with parallelism {op['parallelism']}"
                        )
                    # as on the channels: sequences come back as tuples
                    return msgpack.unpackb(blob, raw=False, strict_map_key=False, use_list=False)
            return None

        if self.reader is not None and self.source_step is not None:
            state = operator_state(self.source_step.name, self.source_step.parallelism)
            if state is not None:
                self.reader.restore(state)
        states: dict[str, Any] = {}
        for op in self.operators:
            states[op.name] = operator_state(op.name, op.step.parallelism)
            if op.keyed_state is not None:
                mine = op.keyed_state.key_groups
                blobs: list[bytes] = []
                for path, info in files_with(op.name):
                    first, last = info.get("key_groups") or (0, 0)
                    if first < mine.stop and mine.start < last:
                        blobs.extend(read_keyed_state(path, op.name, mine))
                op.keyed_state.restore(blobs)
        return states

    # -- control plane -----------------------------------------------------------------
    def _send(self, msg: P.Message) -> None:
        self.control.send(P.encode(msg))

    def _sink_sender(self, step: str) -> Callable[[int, list[Any]], None]:
        def send(checkpoint_id: int, records: list[Any]) -> None:
            self._send(
                P.SinkOutput(
                    self.index, self.attempt, step, self.spec.subtask, checkpoint_id, records
                )
            )

        return send

    def _read_control(self) -> None:
        """Queue every waiting control message; a Cancel raises at once."""
        control = self.control
        while control.poll(0):
            msg = P.decode(control.recv())
            self.last_jm_contact = time.monotonic()
            if isinstance(msg, P.Cancel):
                raise TaskCancelled(msg.reason)
            if not isinstance(msg, P.Alive):
                self.queued_control.append(msg)

    def _serve_control(self) -> None:
        self._read_control()
        while self.queued_control:
            msg = self.queued_control.popleft()
            if isinstance(msg, P.Trigger):
                self._trigger_source_checkpoint(msg)
            elif isinstance(msg, P.Complete):
                self._checkpoint_complete(msg.checkpoint_id)
            elif isinstance(msg, P.Abort) and self.barriers is not None:
                self.barriers.abort(
                    msg.checkpoint_id, P.CheckpointFailureReason.from_wire(msg.reason)
                )

    def _on_backpressure(self) -> None:
        # Called from inside a blocked send: only queue control messages (acting on a
        # trigger here would put a barrier in the middle of a batch), keep heartbeating.
        self._read_control()
        self._housekeeping(time.monotonic())

    def _housekeeping(self, now: float) -> None:
        if now >= self.next_heartbeat:
            self.next_heartbeat = now + self.config.heartbeat_interval
            rss = _rss_bytes()
            self.peak_rss = max(self.peak_rss, rss)
            self._send(
                P.Heartbeat(
                    self.index,
                    self.attempt,
                    self.records_in,
                    self.records_out,
                    rss,
                    self.first_record_at,
                )
            )
            if now - self.last_jm_contact > self.config.heartbeat_timeout:
                raise TaskCancelled("the job manager stopped answering heartbeats")
        if self.pending_writes:
            self._collect_snapshot_writes()

    def _first_record(self) -> None:
        self.first_record_at = time.time()
        self.next_heartbeat = 0.0  # report it at once (start-up and recovery times)

    # -- data path -----------------------------------------------------------------------
    def push(self, batch: list[Any]) -> None:
        """Run a batch through the chain and write the result to the outputs."""
        i = 0
        sink_at = self.sink_position
        try:
            for process in self.processes:
                if i == sink_at:
                    self.records_out += len(batch)
                batch = process(batch)
                if not batch:
                    return
                i += 1
        except (TaskCancelled, OperatorFailure):
            raise
        except Exception as err:
            raise OperatorFailure(self.operators[i].name, err) from err
        self.records_out += len(batch)
        for partitioner, chans in self.outputs:
            for target, part in partitioner.partition(batch):
                chans[target].write(part)

    def _dispatch(self, channel: int, kind: int, frame: bytes) -> None:
        if kind == KIND_DATA:
            batch = decode_records(frame)
            if not self.records_in:
                self._first_record()
            self.records_in += len(batch)
            self.push(batch)
            return
        event = decode_event(frame)
        assert self.barriers is not None
        if kind == KIND_BARRIER:
            assert isinstance(event, Barrier)
            n = event.checkpoint_id
            if n not in self.first_barrier_at:
                self.first_barrier_at[n] = time.time()
                if len(self.barriers.live_channels) > 1:
                    self._maybe_fault("kill_during_alignment", n)
            self.barriers.on_barrier(channel, event)
        elif kind == KIND_END_OF_INPUT:
            self.barriers.on_end_of_input(channel)
        elif kind == KIND_CANCEL:
            assert isinstance(event, CancelBarrier)
            self.barriers.on_cancel(channel, event)

    def _on_frame(self, frame: bytes) -> None:
        channel, kind = _HEADER_UNPACK(frame)
        buf = self.buffers.get(channel)
        if buf is not None:  # blocked, or older frames of this channel still wait for replay
            buf.append(frame)
            return
        self._dispatch(channel, kind & _KIND_MASK, frame)

    def _replay(self, budget: int = 64) -> None:
        """Replay buffered frames of unblocked channels, oldest first, before newer input."""
        for channel in list(self.buffers):
            buf = self.buffers.get(channel)
            while buf is not None and buf and channel not in self.blocked and budget > 0:
                frame = buf.popleft()
                budget -= 1
                self._dispatch(channel, _HEADER_UNPACK(frame)[1] & _KIND_MASK, frame)
                buf = self.buffers.get(channel)
            if buf is not None and not buf and channel not in self.blocked:
                self.spilled_total += buf.spilled_bytes
                buf.close()
                del self.buffers[channel]

    # -- CheckpointActions (called by the barrier handler) --------------------------------
    def block(self, channel: int) -> None:
        self.blocked.add(channel)
        if channel not in self.buffers:
            self.buffers[channel] = SpillBuffer(self.tmpdir, self.config.spill_threshold)

    def unblock_all(self) -> None:
        self.blocked.clear()  # buffers are replayed by the loop before anything newer

    def trigger_checkpoint(self, barrier: Barrier, alignment_started_at: float) -> None:
        now = time.monotonic()
        metrics = {
            "start_delay_ms": round(
                (self.first_barrier_at.pop(barrier.checkpoint_id, time.time()) - barrier.timestamp)
                * 1000,
                3,
            ),
            "alignment_ms": round((now - alignment_started_at) * 1000, 3),
            "spilled_bytes": sum(b.spilled_bytes for b in self.buffers.values()),
        }
        self._checkpoint(barrier, metrics)

    def abort_checkpoint(self, checkpoint_id: int, reason: P.CheckpointFailureReason) -> None:
        self.first_barrier_at.pop(checkpoint_id, None)
        for ch in self.all_channels:
            ch.send_event(CancelBarrier(checkpoint_id))
        self._send(P.Decline(self.index, self.attempt, checkpoint_id, reason.name, reason.message))

    def back_edges_logged(self, checkpoint_id: int) -> None:
        """No task of this runtime has back-edge inputs yet (loops run after the task split)."""

    def end_of_all_inputs(self) -> None:
        self.inputs_ended = True
        for ch in self.all_channels:
            ch.send_event(EndOfInput())

    # -- checkpoints -----------------------------------------------------------------------
    def _trigger_source_checkpoint(self, msg: P.Trigger) -> None:
        barrier = Barrier(msg.checkpoint_id, msg.timestamp, msg.final)
        self._checkpoint(
            barrier,
            {
                "start_delay_ms": round((time.time() - msg.timestamp) * 1000, 3),
                "alignment_ms": 0.0,
                "spilled_bytes": 0,
            },
        )
        if msg.final:
            self.end_of_all_inputs()

    def _checkpoint(self, barrier: Barrier, metrics: dict[str, Any]) -> None:
        """Snapshot (synchronous part), forward the barrier, start the asynchronous write."""
        n = barrier.checkpoint_id
        if barrier.final:
            self.final_checkpoint = n
            for op in self.operators:
                op.finish()
        t0 = time.perf_counter()
        storage = self.env.checkpoint_root
        snaps: dict[str, OperatorSnapshot] = {}
        layout: dict[str, dict[str, Any]] = {}
        if self.reader is not None and self.source_step is not None:
            snaps[self.source_step.name] = OperatorSnapshot(
                msgpack.packb(self.reader.snapshot(), use_bin_type=True), None, None
            )
            layout[self.source_step.name] = {
                "subtask": self.spec.subtask,
                "parallelism": self.source_step.parallelism,
            }
        keys = 0
        for op in self.operators:
            state = op.snapshot_state(n)  # sinks pre-commit here, also without storage
            if storage is None:
                continue
            keyed = op.keyed_state
            op_blob = None if state is None else msgpack.packb(state, use_bin_type=True)
            snaps[op.name] = OperatorSnapshot(
                op_blob, keyed.snapshot() if keyed else None, keyed.key_groups if keyed else None
            )
            layout[op.name] = {"subtask": self.spec.subtask, "parallelism": op.step.parallelism}
            if keyed is not None:
                layout[op.name]["key_groups"] = [keyed.key_groups.start, keyed.key_groups.stop]
                keys += keyed.num_keys()
        metrics["sync_ms"] = round((time.perf_counter() - t0) * 1000, 3)
        metrics["keys"] = keys
        # Counts at the snapshot (a consistent cut): the job's committed record figures.
        metrics["records_in"] = self.records_in
        metrics["records_out"] = self.records_out
        for ch in self.all_channels:
            ch.send_event(barrier)
        if storage is None:
            metrics["async_ms"] = 0.0
            self._send(P.Ack(self.index, self.attempt, n, None, metrics))
            return
        path = os.path.join(storage, f"chk-{n}", f"{self.task_id}.state")
        kill = self._fault("kill_during_snapshot", n)
        future = self.writer.submit(self._write_snapshot, path, snaps, layout, kill)
        self.pending_writes.append((n, future, metrics))

    @staticmethod
    def _write_snapshot(
        path: str, snaps: dict[str, OperatorSnapshot], layout: dict[str, Any], kill: bool
    ) -> dict[str, Any]:
        t0 = time.perf_counter()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if kill:  # fault injection: die with a half-written state file on disk
            with open(path + ".tmp", "wb") as fh:
                fh.write(b"ABSF-partial")
                fh.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        # Keyed state is written as one section per operator (no key-group regrouping in
        # this thread, which competes with the task loop for the GIL); a restore at another
        # parallelism filters the keys by key group.
        info = write_task_snapshot(path, snaps)
        return {
            "file": os.path.basename(path),
            "size": info.size,
            "crc32": info.crc32,
            "operators": layout,
            "async_ms": round((time.perf_counter() - t0) * 1000, 3),
        }

    def _collect_snapshot_writes(self, wait: bool = False) -> None:
        still = []
        for n, future, metrics in self.pending_writes:
            if not wait and not future.done():
                still.append((n, future, metrics))
                continue
            try:
                state = future.result()
            except Exception as err:  # e.g. disk full: decline, the job goes on
                log.warning("task %s: writing checkpoint %d failed: %s", self.task_id, n, err)
                self._send(
                    P.Decline(
                        self.index,
                        self.attempt,
                        n,
                        P.CheckpointFailureReason.STATE_WRITE_FAILED.name,
                        f"{type(err).__name__}: {err}",
                    )
                )
                continue
            metrics["async_ms"] = state.pop("async_ms")
            metrics["state_bytes"] = state["size"]
            self._send(P.Ack(self.index, self.attempt, n, state, metrics))
        self.pending_writes = still

    def _checkpoint_complete(self, checkpoint_id: int) -> None:
        try:
            for op in self.operators:
                op.notify_checkpoint_complete(checkpoint_id)
        except Exception as err:
            raise OperatorFailure(op.name, err) from err
        if self.final_checkpoint is not None and checkpoint_id >= self.final_checkpoint:
            self.completed_final = True

    # -- fault injection ---------------------------------------------------------------
    def _fault(self, kind: str, checkpoint_id: int) -> bool:
        for fault in self.env.faults:
            if (
                fault.kind == kind
                and fault.task_index == self.index
                and fault.attempt == self.attempt
                and checkpoint_id >= (fault.checkpoint_id or 0)
            ):
                return True
        return False

    def _maybe_fault(self, kind: str, checkpoint_id: int) -> None:
        if self._fault(kind, checkpoint_id):
            os.kill(os.getpid(), signal.SIGKILL)

    # -- loops -------------------------------------------------------------------------
    def run(self) -> None:
        """Run until the final checkpoint completed; report failures to the job manager."""
        try:
            if self.is_source:
                self._source_loop()
            else:
                self._input_loop()
            self._flush_all()
            self._send(P.Finished(self.index, self.attempt, self._final_metrics()))
        except TaskCancelled:
            raise
        except OperatorFailure as failure:
            self._report_failure(failure.operator, failure.cause)
            raise TaskCancelled(f"operator '{failure.operator}' failed") from failure
        except Exception as err:
            self._report_failure(self.task_id, err)
            raise

    def _report_failure(self, operator: str, err: BaseException, fatal: bool = False) -> None:
        tb = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        with contextlib.suppress(zmq.ZMQError):
            self._send(
                P.Failed(
                    self.index,
                    self.attempt,
                    operator,
                    self.spec.subtask,
                    f"{type(err).__name__}: {err}",
                    tb,
                    fatal,
                )
            )

    def _final_metrics(self) -> dict[str, Any]:
        return {
            "records_in": self.records_in,
            "records_out": self.records_out,
            "peak_rss": max(self.peak_rss, _rss_bytes()),
            "spilled_bytes": self.spilled_total,
        }

    def _flush_all(self) -> None:
        for ch in self.all_channels:
            ch.flush()

    def _source_loop(self) -> None:
        assert self.reader is not None
        reader, control, cfg = self.reader, self.control, self.config
        batch_size, timeout = cfg.batch_size, cfg.buffer_timeout
        channels = self.all_channels
        while not self.completed_final:
            if control.poll(0) or self.queued_control:
                self._serve_control()
            now = time.monotonic()
            if not self.source_ended:
                batch = reader.read_batch(batch_size)
                if batch is None:
                    self.source_ended = True
                    self._flush_all()
                    self._send(P.SourceEnded(self.index, self.attempt))
                elif batch:
                    if not self.records_in:
                        self._first_record()
                    self.records_in += len(batch)
                    self.push(batch)
                for ch in channels:
                    ch.flush_if_older(now, timeout)
            else:
                self._flush_all()
                if control.poll(int(timeout * 1000) or 1):
                    self._serve_control()
            self._housekeeping(now)
        self._collect_snapshot_writes(wait=True)

    def _input_loop(self) -> None:
        assert self.gate is not None
        gate, control, cfg = self.gate, self.control, self.config
        poller = zmq.Poller()
        poller.register(gate.socket, zmq.POLLIN)
        poller.register(control, zmq.POLLIN)
        timeout_ms = max(1, int(cfg.buffer_timeout * 1000))
        channels = self.all_channels
        on_frame = self._on_frame
        while not self.completed_final:
            replaying = any(ch not in self.blocked for ch in self.buffers)
            if replaying:
                self._replay()
            events = dict(poller.poll(0 if replaying else timeout_ms))
            if control in events or self.queued_control:
                self._serve_control()
            if gate.socket in events:
                for frame in gate.recv_frames(64):
                    on_frame(frame)
            elif not replaying:
                for ch in channels:  # idle: send partial batches now
                    ch.flush()
            now = time.monotonic()
            for ch in channels:
                ch.flush_if_older(now, cfg.buffer_timeout)
            self._housekeeping(now)
        self._collect_snapshot_writes(wait=True)

    def close(self, graceful: bool) -> None:
        """Close sockets, operators and temp files (not reached after SIGKILL)."""
        if graceful:
            for op in self.operators:
                try:
                    op.close()
                except Exception as err:
                    log.warning("task %s: closing '%s' failed: %s", self.task_id, op.name, err)
        if self.reader is not None:
            self.reader.close()
        self.writer.shutdown(wait=True)
        for buf in self.buffers.values():
            buf.close()
        for ch in self.all_channels:
            ch.close(linger_ms=1000 if graceful else 0)
        with contextlib.suppress(zmq.ZMQError):
            self._send(P.Closed(self.index, self.attempt))
        self.control.close(linger=2000 if graceful else 500)
        shutil.rmtree(self.tmpdir, ignore_errors=True)


def run_barrier_task(plan: JobPlan, env: TaskEnvironment) -> list[Any]:
    """Entry point inside a Spark barrier task (the Python worker process)."""
    import json

    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    index = ctx.partitionId()
    spec = plan.tasks[index]
    host = ctx.getTaskInfos()[index].address.rsplit(":", 1)[0]
    with contextlib.suppress(OSError):
        host = socket.gethostbyname(host)  # bind needs an address, Spark may give a name
    zctx = zmq.Context()
    gate: InputGate | None = None
    task: Task | None = None
    graceful = False
    try:
        gate = InputGate(zctx, host, rcvhwm=env.config.channel_hwm) if spec.inputs else None
        gathered = ctx.allGather(json.dumps([index, gate.endpoint if gate else ""]))
        endpoints = {i: ep for i, ep in (json.loads(m) for m in gathered)}
        task = Task(plan, spec, env, zctx, gate, endpoints, host)
        task.run()
        graceful = True
    except TaskCancelled:
        pass
    finally:
        if task is not None:
            task.close(graceful)
        if gate is not None:
            gate.close()
        # Closes whatever a half-built Task left open (term() alone would wait forever),
        # giving a queued Failed message up to a second to leave.
        zctx.destroy(linger=1000)
    return []
