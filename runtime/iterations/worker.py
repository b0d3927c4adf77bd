"""One iteration task: a loop head that owns one partition of the iteration state.

Per superstep k (started by the job manager's ``SuperstepGo(k)``): send every message
of the superstep to the partitions that own the target keys, then the superstep marker
(``KIND_SUPERSTEP``, in band, after the data on every channel); receive until the
marker of k has come from every partition (FIFO channels: everything before it belongs
to k); update; report ``SuperstepDone(k)``; wait for the job manager's decision, which
comes only when every task reported (no time-out, no idle detection anywhere).

Sockets: one PULL per task (unbounded queue: a head always drains, so two heads that
send to each other at once cannot deadlock), PUSH to each peer, a DEALER to the job
manager. While waiting, the task answers a ``RescueRequest`` with its partition as of
the superstep the job manager names, which it still holds: the committed state (before
the superstep in progress) and the proposed one (after it) are both kept until the job
manager agrees.
"""

from __future__ import annotations

import os
import time
import traceback
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from channels import messages as M
from runtime import control as P
from runtime import superstep_control as S
from runtime.iterations.api import IterationError, IterationSpec
from runtime.iterations.loop_plan import LoopChannels, iteration_plan
from runtime.iterations.partition import PartitionCompute, encode_state
from runtime.iterations.snapshots import PartWriter, SuperstepStore, write_whole

__all__ = ["WorkerContext", "WorkerStopped", "run_worker"]

_BATCH = 65536  # flat items (key, message, key, message, ...) per data frame


class WorkerStopped(Exception):
    """The job manager cancelled this attempt."""


@dataclass(frozen=True)
class WorkerContext:
    """What one task needs besides the spec: where its input is, how to reach the
    others, how to die (fault injection)."""

    index: int
    attempt: int
    start_superstep: int
    input_root: str  # SuperstepStore holding sstep-<start>/part-<i>
    side_root: str  # SuperstepStore holding sstep-0/part-<i> (the side input)
    checkpoint_root: str
    jm_endpoint: str
    host: str


def run_worker(
    spec: IterationSpec,
    wctx: WorkerContext,
    exchange: Callable[[str], list[str]],
    die: Callable[[int], None],
) -> None:
    zctx = zmq.Context()
    pull = zctx.socket(zmq.PULL)
    ctl = zctx.socket(zmq.DEALER)
    pushes: dict[int, zmq.Socket[bytes]] = {}
    try:
        pull.setsockopt(zmq.RCVHWM, 0)
        port = pull.bind_to_random_port(f"tcp://{wctx.host}")
        endpoint = f"tcp://{wctx.host}:{port}"
        ctl.setsockopt(zmq.IDENTITY, f"{wctx.index}:{wctx.attempt}".encode())
        ctl.setsockopt(zmq.LINGER, 2000)
        ctl.connect(wctx.jm_endpoint)
        endpoints = exchange(endpoint)
        loop = LoopChannels.of(iteration_plan(spec), wctx.index)
        for j in loop.peers:  # the feedback edge's channels out of this task
            s = zctx.socket(zmq.PUSH)
            s.setsockopt(zmq.SNDHWM, 0)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(endpoints[j])
            pushes[j] = s
        head = _Head(spec, wctx, loop, pull, ctl, pushes, die)
        ctl.send(
            P.encode(
                P.Register(
                    wctx.index, wctx.attempt, f"iter-{wctx.index}", os.getpid(), wctx.host, endpoint
                )
            )
        )
        try:
            head.run()
        except (WorkerStopped, KeyboardInterrupt):
            pass
        except Exception as err:
            fatal = isinstance(err, IterationError)
            ctl.send(
                P.encode(
                    P.Failed(
                        wctx.index,
                        wctx.attempt,
                        P.TaskFailureCause.USER_FUNCTION_RAISED,
                        spec.step.name,
                        wctx.index,
                        str(err),
                        traceback.format_exc(),
                        fatal,
                    )
                )
            )
    finally:
        for s in pushes.values():
            s.close(0)
        pull.close(0)
        ctl.close()
        zctx.term()


class _Head:
    def __init__(
        self,
        spec: IterationSpec,
        wctx: WorkerContext,
        loop: LoopChannels,
        pull: zmq.Socket[bytes],
        ctl: zmq.Socket[bytes],
        pushes: dict[int, zmq.Socket[bytes]],
        die: Callable[[int], None],
    ) -> None:
        self.loop = loop
        self.spec, self.wctx, self.pull, self.ctl, self.pushes, self.die = (
            spec,
            wctx,
            pull,
            ctl,
            pushes,
            die,
        )
        options = spec.recovery.storage_options
        solution, workset = SuperstepStore(wctx.input_root, options).read_part(
            wctx.start_superstep, wctx.index
        )
        side, _ = SuperstepStore(wctx.side_root, options).read_part(0, wctx.index)
        self.compute = PartitionCompute(spec, wctx.index, solution, workset, side)
        self.store = SuperstepStore(wctx.checkpoint_root, options)
        self.committed = wctx.start_superstep  # the superstep compute.solution is the state after
        self.proposed: int | None = None
        self.markers: dict[int, int] = defaultdict(int)
        self.totals: dict[int, float] = defaultdict(float)
        self.head_writer: PartWriter | None = None
        self.received = 0  # messages absorbed since the last update (the next superstep's)
        self.durable = -1
        self.poller = zmq.Poller()
        self.poller.register(pull, zmq.POLLIN)
        self.poller.register(ctl, zmq.POLLIN)

    # -- the loop -------------------------------------------------------------------
    def run(self) -> None:
        while True:
            go = self._wait_decision()
            if go.stop:
                self._finish(go.superstep)
                return
            self._superstep(go.superstep)

    def _wait_decision(self) -> S.SuperstepGo:
        while True:
            msg = self._next_control(block=True)
            if isinstance(msg, S.SuperstepGo):
                return msg

    def _superstep(self, k: int) -> None:
        rec = self.spec.recovery
        mode = rec.checkpoint_mode
        if self.proposed is not None:  # the job manager agreed on self.proposed
            self.compute.commit()
            self.committed, self.proposed = self.proposed, None
            if mode == "head" and self.committed % rec.interval == 0 and self.committed > 0:
                self.head_writer = write_whole(
                    self.store,
                    self.committed,
                    self.wctx.index,
                    self.compute.solution,
                    self.compute.workset,
                    self.wctx.attempt,
                )
        started = time.perf_counter()
        out, contribution = self.compute.emit()
        sent = sum(len(flat) for flat in out) // 2  # flat: key, message, key, message, ...
        for j, flat in enumerate(out):
            if j == self.wctx.index:
                self._absorb(flat)
                continue
            for i in range(0, len(flat), _BATCH):
                self.pushes[j].send(M.encode_data(self.wctx.index, flat[i : i + _BATCH]))
        for s in self.pushes.values():
            s.send(M.encode_superstep(self.wctx.index, k, contribution))
        self.markers[k] += 1
        self.totals[k] += contribution
        while self.markers[k] < len(self.loop.marker_sources):  # one per feedback input
            self._poll_once()
        total = self.totals.pop(k)
        del self.markers[k]
        received, self.received = self.received, 0  # FIFO: all of k's, none of k + 1's
        if self.head_writer is not None:  # head: the write overlapped this superstep
            self.head_writer.wait()
            self.durable, self.head_writer = self.head_writer.superstep, None
        checkpoint = mode in ("blocking", "tail") and k % rec.interval == 0
        if checkpoint and mode == "tail":
            writer = PartWriter(self.store, k, self.wctx.index, self.wctx.attempt)
            outcome = self.compute.update(total, sink=writer)
            writer.wait()
        else:
            outcome = self.compute.update(total)
            if checkpoint:
                solution, workset = self.compute.proposed()
                write_whole(
                    self.store, k, self.wctx.index, solution, workset, self.wctx.attempt
                ).wait()
        if checkpoint:
            self.durable = k
        self.proposed = k
        seconds = time.perf_counter() - started
        self.ctl.send(
            P.encode(
                S.SuperstepDone(
                    self.wctx.index,
                    self.wctx.attempt,
                    k,
                    outcome.aggregate,
                    outcome.active,
                    self.durable,
                    seconds,
                    sent,
                    received,
                )
            )
        )

    def _poll_once(self) -> None:
        events = dict(self.poller.poll())
        if self.ctl in events:
            self._next_control(block=False)
        if self.pull in events:
            self._drain_pull()

    def _absorb(self, flat: Any) -> None:
        self.compute.absorb(flat)
        self.received += len(flat) // 2

    def _drain_pull(self) -> None:
        """Everything queued on the data channels (data and markers of the next
        superstep may come before our Go does: FIFO keeps them apart)."""
        while True:
            try:
                frame = self.pull.recv(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                break
            _, kind = M.decode_header(frame)
            if kind == M.KIND_DATA:
                self._absorb(M.decode_records(frame))
            elif kind == M.KIND_SUPERSTEP:
                step, contribution = M.decode_superstep(frame)
                self.markers[step] += 1
                self.totals[step] += contribution
            else:
                raise IterationError(f"iteration '{self.spec.name}': unexpected frame kind {kind}")

    # -- control ----------------------------------------------------------------------
    def _next_control(self, block: bool) -> P.Message | None:
        """Handle rescue, cancel and kill here; return a decision (or None)."""
        while True:
            if not block and not self.ctl.poll(0):
                return None
            if block:
                while not self.ctl.poll(50):
                    self._drain_pull()
            msg = S.decode(self.ctl.recv())
            if isinstance(msg, S.SuperstepGo):
                return msg
            if isinstance(msg, S.RescueRequest):
                self._send_state(msg.superstep)
            elif isinstance(msg, P.Cancel):
                raise WorkerStopped(msg.reason)
            elif isinstance(msg, P.KillSelf):
                self.die(msg.signal)

    def _state_after(self, superstep: int) -> tuple[dict[Any, Any], set[Any] | None]:
        if superstep == self.committed:
            return self.compute.solution, self.compute.workset
        if superstep == self.proposed:
            return self.compute.proposed()
        raise IterationError(
            f"iteration '{self.spec.name}': task {self.wctx.index} holds supersteps "
            f"{self.committed} and {self.proposed}, not {superstep}"
        )

    def _send_state(self, superstep: int) -> None:
        solution, workset = self._state_after(superstep)
        payload = encode_state(solution, workset)
        self.ctl.send(
            P.encode(S.PartitionState(self.wctx.index, self.wctx.attempt, superstep, payload))
        )

    def _finish(self, superstep: int) -> None:
        if self.head_writer is not None:
            self.head_writer.wait()
        self._send_state(superstep)
        while True:  # stay until the job manager has the state and says so
            msg = self._next_control(block=True)
            if msg is None or isinstance(msg, S.SuperstepGo):
                continue
