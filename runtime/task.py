"""The task: one chain of operators in one long-lived process, and its loop.

A task reads batches from its input gate (one PULL socket shared by all its input
channels), pushes each batch through its chain, and writes the result to its output
channels. Barriers, end-of-input and cancel markers arrive in band; the barrier
handler (``runtime.barriers``) decides when to block a channel and when to snapshot.
Control messages (trigger, complete, abort, cancel) arrive from the job manager.

`Task` owns and wires the objects that do the work: `OperatorChain` (the operators,
the per-batch path); `InputSide` (decodes frames into typed elements, the input
watermark); `BlockedChannels` (buffers and replays blocked channels); a barrier handler
(`BarrierAligner` or `BarrierTracker`, the one source of truth of which channels are
blocked); `TaskCheckpointer` (capture, forward, log back-edges, write, ack);
`FeedbackQueue` (a loop head's back-edge frames); `ControlClient` (the job manager's
socket, heartbeats); `TaskFaults`, `ScratchDir`; `TaskIO` (sockets, fakes in tests).
Lifecycle: construct (no I/O) -> ``open()`` (temp dir, sockets, operators, restore)
-> ``run()`` -> ``close(graceful)``. Threading: everything runs on the task-loop
thread, except the asynchronous part of a snapshot (the checkpointer's writer thread).
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from typing import Any

from channels.messages import (
    HEADER,
    KIND_MASK,
    Barrier,
    CancelBarrier,
    SuperstepMarker,
    Watermark,
    decode_records,
)
from runtime import control as P
from runtime.barriers import BarrierHandler, BarrierProtocolError
from runtime.chain import OperatorChain
from runtime.checkpointer import TaskCheckpointer, TaskIdentity
from runtime.config import SnapshotMode
from runtime.control import TaskFailureCause
from runtime.control_client import ControlClient
from runtime.errors import (
    CheckpointStorageError,
    GraphError,
    OperatorFailure,
    RecordSerializationError,
    TaskCancelled,
)
from runtime.feedback import FeedbackQueue
from runtime.graph import StepKind
from runtime.input_side import InputSide, input_sides
from runtime.inputs import BlockedChannels
from runtime.overtaking import OvertakingInput
from runtime.plan import JobPlan, TaskSpec
from runtime.scratch import ScratchDir
from runtime.snapshot_modes import handler_for, in_flight_log_for, overtaking_input_for
from runtime.sources import SourceReader
from runtime.superstep import SuperstepHead, SuperstepOperator
from runtime.task_environment import TaskEnvironment
from runtime.task_faults import TaskFaults
from runtime.task_io import TaskIO
from runtime.task_metrics import TaskCounters
from runtime.task_outputs import TaskOutputs
from runtime.watermarks import END_OF_TIME
from statebackend.metrics import TaskMetrics
from statebackend.restore import plan_restore

log = logging.getLogger("absflow.task")

__all__ = ["OperatorFailure", "Task", "TaskCancelled"]


class Task:
    """Runs one subtask of one chain until the job ends or the task is cancelled."""

    def __init__(
        self, plan: JobPlan, spec: TaskSpec, env: TaskEnvironment, io: TaskIO, host: str
    ) -> None:
        self.plan, self.spec, self.env, self.io, self.host = plan, spec, env, io, host
        self.config = cfg = env.config
        self.identity = TaskIdentity(spec.index, env.attempt, spec.task_id, host)
        self.faults = TaskFaults(env.faults, spec.index, env.attempt)
        self.scratch = ScratchDir(env.run_id, env.attempt, spec.index)
        self.chain = OperatorChain(
            plan,
            spec,
            env.attempt,
            self._send_sink_output,
            self.faults,
            cfg,
            lambda: self.scratch.path,
            env.run_id,
        )
        # A source with watermark alignment reports its watermark as often as alignment
        # needs it (each heartbeat is answered with the lowest aligned watermark).
        aligned = self.chain.assigner is not None and self.chain.assigner.max_drift is not None
        interval = min(cfg.heartbeat_interval, cfg.alignment_interval) if aligned else None
        self.control = ControlClient(
            io.control_socket, interval or cfg.heartbeat_interval, cfg.heartbeat_timeout
        )
        self.out = TaskOutputs()
        self.chain.emit = self.out.emit
        # Event time: watermarks are sent only by jobs that assign timestamps.
        self.event_time = any(s.kind is StepKind.ASSIGN_TIMESTAMPS for s in plan.steps)
        self.input_side = InputSide(self, input_sides(plan, spec), spec.regular_inputs)
        self._dispatch = self.input_side.dispatch
        self.storage = env.open_storage(env.checkpoint_root) if env.checkpoint_root else None
        self.channels = self.out.channels  # every output channel, filled by open()

        self._handler: BarrierHandler | None = None
        self.inputs = (
            BlockedChannels(
                self._dispatch,
                self._blocked_channels,
                lambda: self.scratch.path,
                cfg.spill_threshold,
            )
            if spec.inputs
            else None
        )
        # A loop head: back-edge inputs on a gate of their own, logged in checkpoints.
        self.back_edges = frozenset(spec.back_edge_inputs)
        self.head_step = plan.chain_steps(spec)[0]
        self.feedback: FeedbackQueue | None = None
        # Records in flight at a snapshot (a loop head's back-edge log, an unaligned
        # checkpoint's channel state) are stored like the operator state of a step.
        if self.back_edges:
            if io.feedback_gate is None:
                raise GraphError(f"task {spec.task_id} has back-edge inputs but no feedback gate")
            self.feedback = FeedbackQueue(
                io.feedback_gate, self._dispatch, lambda: self.scratch.path, cfg.spill_threshold
            )
        self.in_flight = in_flight_log_for(
            spec,
            plan,
            self.head_step.name,
            self.head_step.parallelism,
            cfg,
            lambda: self.scratch.path,
        )
        self.checkpointer = TaskCheckpointer(
            self.identity,
            self.chain,
            self.channels,
            self.storage,
            self.control.send,
            self.inputs,
            self.faults,
            counts=lambda: (self.counters.records_in, self.chain.records_out),
            in_flight=self.in_flight,
            synchronous=cfg.snapshot_mode is SnapshotMode.SYNCHRONOUS,
            overtake=cfg.barriers_overtake,
        )
        self.overtaking: OvertakingInput | None = None  # unaligned: barriers overtake input
        if spec.inputs and self.inputs is not None:
            self._handler = handler_for(spec, self.checkpointer, cfg)
            self.overtaking = overtaking_input_for(
                self._handler, io, self.checkpointer, self.inputs.on_frame, self.scratch, cfg
            )
        self._replay: list[bytes] = []  # restored in-flight records, replayed before new input
        self.supersteps: SuperstepHead | None = None  # an iteration's loop head (open())

        self.counters = TaskCounters()  # metrics, and the counts of loop termination

    # -- set-up ------------------------------------------------------------------------
    def open(self) -> None:
        """Create the temp dir, connect the sockets, open the operators, register with the
        job manager and restore. A checkpoint that does not fit is reported as fatal."""
        self.counters.open()
        self.scratch.open()
        self.control.open()
        self.out.open(self.io, self.plan, self.spec, self._on_backpressure)
        self.chain.open()
        self.supersteps = self._superstep_head()
        self.checkpointer.start()
        gate = self.io.gate
        spec, env = self.spec, self.env
        self.control.send(
            P.Register(
                spec.index,
                env.attempt,
                spec.task_id,
                os.getpid(),
                self.host,
                gate.endpoint if gate else "",
            )
        )
        states: dict[str, Any] = {}
        if env.restore_metadata is not None and env.restore_root is not None:
            try:
                head, targets = self.in_flight, self.chain.restore_targets()
                if head is not None:
                    targets.append(head.restore_target())
                plan = plan_restore(env.restore_metadata, spec.subtask, targets)
                storage = env.open_storage(env.restore_root)
                states = self.chain.restore_state(plan, storage)
                if head is not None and not self.config.debug_drop_in_flight_log:
                    self._replay = head.read_log(plan, storage)
            except Exception as err:  # the checkpoint does not fit: restarting cannot help
                self._report_failure(TaskFailureCause.TASK_ERROR, spec.task_id, err, fatal=True)
                where = f"checkpoint {env.restore_metadata.checkpoint_id} in {env.restore_root}"
                raise TaskCancelled(f"restoring {where} failed: {err}") from err
        self.chain.apply_operator_states(states)
        self.input_side.valve.restore(self.chain.restore_watermark(env.restore_metadata))
        rescued = env.restore_metadata is not None and env.restore_metadata.rescue is not None
        if rescued and self.supersteps is not None:  # optimistic recovery: keep survivors
            self.supersteps.operator.keep_restored()

    def _superstep_head(self) -> SuperstepHead | None:
        """The superstep protocol, if this task is an iteration's loop head: its feedback
        edge (the output into its own loop head), its result edge (the other output) and
        the feedback channels it aligns superstep markers on."""
        op = next((o for o in self.chain.operators if isinstance(o, SuperstepOperator)), None)
        if op is None:
            return None
        plan, spec = self.plan, self.spec
        loop_head = self.head_step.id
        into_head = [
            i
            for i, out in enumerate(spec.outputs)
            if plan.channels[out.channels[0]].target_step == loop_head
        ]
        if len(into_head) != 1 or len(spec.outputs) != 2:
            raise GraphError(
                f"task {spec.task_id}: superstep step '{op.name}' needs its feedback edge "
                "and one result edge as the outputs of its task"
            )
        feedback_edge = into_head[0]
        feedback_channels = [c for c in spec.inputs if plan.channels[c].source_step == op.step.id]
        return SuperstepHead(
            op,
            self.identity.index,
            self.identity.attempt,
            self.out,
            feedback_edge,
            1 - feedback_edge,
            feedback_channels,
            self.control.send,
            self._deliver_barrier,
            lambda: self._handler.latest_checkpoint_id if self._handler is not None else 0,
        )

    # -- control plane -----------------------------------------------------------------
    def _send_sink_output(
        self, step: str, subtask: int, checkpoint: int, records: list[Any] | bytes
    ) -> None:
        t = self.identity
        self.control.send(P.SinkOutput(t.index, t.attempt, step, subtask, checkpoint, records))

    def _serve_control(self) -> None:
        """Act on the job manager's messages (between two batches only)."""
        for msg in self.control.take():
            if isinstance(msg, P.Trigger):
                if msg.drain:  # a stop with drain: every window fires before the savepoint
                    self.on_watermark(END_OF_TIME)
                self.checkpointer.trigger_source(msg)
            elif isinstance(msg, P.Halt):
                self.checkpointer.halt(msg.checkpoint_id)
            elif isinstance(msg, P.Complete):
                self.checkpointer.complete(msg.checkpoint_id)
            elif isinstance(msg, P.Abort):
                self.checkpointer.aborted(msg.checkpoint_id)
                self.chain.notify_aborted(msg.checkpoint_id)
                if self._handler is not None:
                    self._handler.abort(msg.checkpoint_id, msg.reason)
                if self.supersteps is not None:
                    self.supersteps.aborted(msg.checkpoint_id)
            elif isinstance(msg, P.SuperstepGo):
                self._superstep_head_of(msg).on_go(msg)
            elif isinstance(msg, P.EmitSolution):
                self._superstep_head_of(msg).emit_solution(msg.superstep)
            elif isinstance(msg, P.Rescue):
                self._superstep_head_of(msg).rescue(msg.checkpoint_id, self.checkpointer.rescue)
            elif isinstance(msg, P.CompensationRequest):
                self._superstep_head_of(msg).send_compensation_input()
            elif isinstance(msg, P.Compensate):
                self._superstep_head_of(msg).compensate(msg)
            elif isinstance(msg, P.LoopProbe):
                t = self.identity
                received = 0 if self.chain.reader is not None else self.counters.records_in
                self.control.send(
                    P.LoopStatus(
                        t.index, t.attempt, msg.round, self.out.records_sent, received, msg.tag
                    )
                )

    def _on_backpressure(self) -> None:
        # Called from inside a blocked send: only queue control messages (acting on a
        # trigger here would put a barrier in the middle of a batch), keep heartbeating,
        # and keep reading the back-edges (a loop must never block its own feedback).
        self.control.read()
        if self.supersteps is not None and not self.config.debug_rescue_after_send:
            self._rescue_now()  # a rescue must not wait for a send to a dead loop head
        if self.feedback is not None:
            self.feedback.drain()
        self._housekeeping(time.monotonic(), timers=False)  # no records in a blocked send

    def _rescue_now(self) -> None:
        """Serve a queued ``Rescue`` inside a blocked send: the keyed state of a loop head
        is never mid-update there (its loading, absorbing and updating send nothing), and
        after a failure its sends may block for good on a dead peer's channel."""
        head = self.supersteps
        assert head is not None
        for msg in self.control.take_of(P.Rescue):
            head.rescue(msg.checkpoint_id, self.checkpointer.rescue)

    def _heartbeat(self) -> P.Heartbeat:
        m, t = self._measure(), self.identity
        return P.Heartbeat(t.index, t.attempt, m)

    def _measure(self) -> TaskMetrics:
        return self.counters.measure(
            self.chain,
            self.channels,
            (self.feedback, self.overtaking),
            self.inputs,
            self.io,
            self.input_side,
        )

    def _housekeeping(self, now: float, timers: bool = True) -> None:
        self.control.heartbeat(now, self._heartbeat)
        if timers and self.chain.timed and not self.checkpointer.halted:  # not in a halt
            self.chain.on_processing_time(time.time())
        if self.checkpointer.writes_pending:
            self.checkpointer.collect_writes()

    def _first_record(self) -> None:
        self.counters.first_record_at = time.time()
        self.control.heartbeat_soon()  # report it at once (start-up and recovery times)

    # -- data path -----------------------------------------------------------------------
    def push(self, batch: list[Any], side: int = 0) -> None:
        """Run a batch through the chain and write the result to the outputs."""
        batch = self.chain.process(batch, side)
        if batch:
            self.out.emit(batch)

    def _send_watermark(self, event: Watermark) -> None:
        if self.event_time:  # jobs without event time send no watermarks
            self.out.send_watermark(event)

    def _blocked_channels(self) -> frozenset[int]:
        return self._handler.blocked_channels if self._handler is not None else frozenset()

    # -- the input side's elements (runtime.input_side.InputElements) ---------------------
    def on_batch(self, channel: int, side: int, batch: list[Any], frame: bytes) -> None:
        handler, counters = self._handler, self.counters
        if not counters.records_in:
            self._first_record()
        counters.records_in += len(batch)
        counters.bytes_in += len(frame)
        if self.overtaking is None and handler and channel in handler.logging_channels:
            self.faults.while_logging(handler.logging_checkpoint or 0)
            self.checkpointer.log(frame, len(batch))
        self.push(batch, side)

    def _event_handler(self, channel: int) -> BarrierHandler:
        if self._handler is None:
            raise BarrierProtocolError(f"task {self.spec.task_id}: event on {channel}, no inputs")
        return self._handler

    def on_barrier(self, channel: int, barrier: Barrier) -> None:
        if self.supersteps is not None:  # an iteration's head may hold it (tail checkpoints)
            self.supersteps.on_barrier(channel, barrier)
        else:
            self._deliver_barrier(channel, barrier)

    def _deliver_barrier(self, channel: int, barrier: Barrier) -> None:
        handler = self._event_handler(channel)
        self.faults.before_barrier(handler, barrier.checkpoint_id)
        handler.on_barrier(channel, barrier)

    def on_cancel(self, channel: int, cancel: CancelBarrier) -> None:
        self._event_handler(channel).on_cancel(channel, cancel)

    def on_end_of_input(self, channel: int) -> None:
        self._event_handler(channel).on_end_of_input(channel)

    def on_superstep(self, channel: int, marker: SuperstepMarker) -> None:
        if self.supersteps is None:
            raise BarrierProtocolError(
                f"task {self.spec.task_id}: a superstep marker on channel {channel}, but the "
                "task is no iteration's loop head"
            )
        self.supersteps.on_marker(channel, marker)

    def _superstep_head_of(self, msg: P.Message) -> SuperstepHead:
        if self.supersteps is None:
            raise BarrierProtocolError(
                f"task {self.spec.task_id}: {msg!r}, but the task is no iteration's loop head"
            )
        return self.supersteps

    def on_watermark(self, watermark: float) -> None:
        if self.chain.advance_watermark(watermark):
            self._send_watermark(Watermark(watermark))

    def on_idle(self) -> None:
        self._send_watermark(Watermark(self.chain.watermark, idle=True))

    # -- loops -------------------------------------------------------------------------
    def run(self) -> None:
        """Run until the final checkpoint completed; report failures to the job manager."""
        try:
            if self.chain.reader is not None:
                self._source_loop(self.chain.reader)
            else:
                self._input_loop()
            self._flush_all()
            t = self.identity
            self.control.send(P.Finished(t.index, t.attempt, self._measure()))
        except TaskCancelled:
            raise
        except RecordSerializationError as err:  # a restart would meet the same record
            named = err if err.step else err.naming(self.chain.output_step)
            if named.step:  # the step that emitted it
                cause, where = TaskFailureCause.USER_FUNCTION_RAISED, named.step
            else:
                cause, where = TaskFailureCause.TASK_ERROR, self.spec.task_id
            self._report_failure(cause, where, named, fatal=True)
            raise TaskCancelled(f"step '{named.step}' emitted a record that cannot cross") from err
        except OperatorFailure as failure:
            cause = TaskFailureCause.USER_FUNCTION_RAISED
            self._report_failure(cause, failure.operator, failure.cause, failure.fatal)
            raise TaskCancelled(f"operator '{failure.operator}' failed") from failure
        except Exception as err:  # storage this executor cannot write: restarts cannot help
            fatal = isinstance(err, CheckpointStorageError)
            self._report_failure(TaskFailureCause.TASK_ERROR, self.spec.task_id, err, fatal)
            raise

    def _report_failure(
        self, cause: TaskFailureCause, operator: str, err: BaseException, fatal: bool = False
    ) -> None:
        tb = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        t = self.identity
        self.control.send_quietly(
            P.Failed(
                t.index,
                t.attempt,
                cause,
                operator,
                self.spec.subtask,
                f"{type(err).__name__}: {err}",
                tb,
                fatal,
            )
        )

    def _flush_all(self) -> None:
        self.out.flush()

    def _source_loop(self, reader: SourceReader) -> None:
        control, checkpointer, cfg = self.control, self.checkpointer, self.config
        batch_size, timeout = cfg.batch_size, cfg.buffer_timeout
        source_ended = False
        while not checkpointer.completed_final:
            if control.has_messages():
                self._serve_control()
            now = time.monotonic()
            if checkpointer.halted:  # synchronous snapshots: wait for the checkpoint's end
                self._flush_all()
                if control.wait(int(timeout * 1000) or 1):
                    self._serve_control()
            elif self._ahead_of_alignment():  # watermark alignment: wait for the others
                self._flush_all()
                if control.wait(int(timeout * 1000) or 1):
                    self._serve_control()
                self.counters.aligned_pause_seconds += time.monotonic() - now
            elif not source_ended and checkpointer.final_checkpoint is None:
                batch = reader.read_batch(batch_size)
                if batch is None:
                    source_ended = True
                    if self.chain.advance_watermark(END_OF_TIME):  # event time is over
                        self._send_watermark(Watermark(END_OF_TIME))
                    self._flush_all()
                    self.control.send(P.SourceEnded(self.identity.index, self.identity.attempt))
                elif batch:
                    if not self.counters.records_in:
                        self._first_record()
                    self.counters.records_in += len(batch)
                    self.push(batch)
                mark = self.chain.poll_watermark() if not source_ended else None
                if mark is not None:
                    self._send_watermark(mark)
                self.out.flush_if_older(now, timeout)
            else:
                self._flush_all()
                if control.wait(int(timeout * 1000) or 1):
                    self._serve_control()
            self._housekeeping(now)
        checkpointer.collect_writes(wait=True)

    def _ahead_of_alignment(self) -> bool:
        """A source with ``max_drift`` whose watermark is more than that ahead of the
        lowest of the job's aligned sources (as of the last heartbeat's answer)."""
        assigner = self.chain.assigner
        if assigner is None or assigner.max_drift is None or self.checkpointer.halted:
            return False
        low = self.control.aligned_watermark
        return low is not None and self.chain.watermark > low + assigner.max_drift

    def _input_loop(self) -> None:
        # Restored in-flight records (a back-edge log, channel state) go first.
        replay, self._replay = self._replay, []
        for frame in replay:
            channel, kind = HEADER.unpack_from(frame)
            if self.back_edges:  # it was in flight around the loop, as sent
                self.out.records_sent += len(decode_records(frame))
            self._dispatch(channel, kind & KIND_MASK, frame)
        handler = self._handler
        # A loop head also waits for the end of input to come around its back-edges.
        while not self.checkpointer.completed_final or (
            handler is not None and handler.back_edges_live
        ):
            self.turn()
        self.checkpointer.collect_writes(wait=True)

    def turn(self) -> None:
        """One turn of the input loop: replay unblocked buffers, act on control messages,
        read up to 64 frames (waiting up to ``buffer_timeout`` for input when idle),
        flush old partial batches, heartbeat and collect finished state writes."""
        gate, inputs = self.io.gate, self.inputs
        if gate is None or inputs is None:
            raise BarrierProtocolError(f"task {self.spec.task_id} has no source and no inputs")
        timeout = self.config.buffer_timeout
        feedback = self.feedback
        looping = False
        if feedback is not None:  # feedback first: regular inputs wait (backpressure)
            feedback.drain()
            looping = feedback.process(64) > 0 or len(feedback) > 0
        replaying = inputs.replaying
        if replaying:
            inputs.replay()
        overtaking = self.overtaking
        busy = replaying or looping or bool(overtaking)
        waited = time.monotonic()
        gate_ready, control_ready = self.io.wait(0 if busy else max(1, int(timeout * 1000)))
        self.counters.idle_seconds += 0.0 if busy else time.monotonic() - waited
        if control_ready or self.control.has_messages():
            self._serve_control()
        if self._handler is not None:
            self._handler.tick()
        if overtaking is not None:  # read first: barriers act when read
            overtaking.read()
            busy = overtaking.process() > 0 or busy
        elif gate_ready and not looping:
            on_frame = inputs.on_frame
            for frame in gate.recv_frames(64):
                on_frame(frame)
        if not busy and not gate_ready:
            self.out.flush()  # idle: send partial batches now
        now = time.monotonic()
        self.out.flush_if_older(now, timeout)
        self._housekeeping(now)

    def close(self, graceful: bool) -> None:
        """Close operators, sockets and temp files (not reached after SIGKILL); safe after
        a failed or partial ``open()``."""
        self.chain.close(graceful)
        self.checkpointer.close()
        if self.inputs is not None:
            self.inputs.close()
        for queue in (self.feedback, self.overtaking):
            if queue is not None:
                queue.close()
        self.scratch.close()  # before Closed: the job manager may end the process after it
        self.out.close(graceful)
        t = self.identity
        self.control.send_quietly(P.Closed(t.index, t.attempt))
        self.control.close(linger_ms=2000 if graceful else 500)
