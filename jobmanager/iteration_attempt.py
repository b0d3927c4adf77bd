"""One attempt of an iteration, driven from the job manager: registration, the
superstep agreement, checkpoint completion, the final collection, and (on a failure)
the rescue read of the survivors.

Agreement: superstep k is agreed when every task's ``SuperstepDone(k)`` is in; only
then does the job manager decide (stop: converged / workset empty / max_supersteps; or
go on with k + 1). A slow task makes everyone wait, nothing times out.

Each agreement is also one wave of the loop termination's counting (Mattern's
counters, ``jobmanager.termination.Wave``): the messages sent on the feedback edge in
superstep k and those received for k. The loop termination needs two equal balanced
waves because its probes cut a running loop anywhere; here the markers of k close
every channel first (FIFO), so the agreement is a consistent cut and one balanced wave
proves that nothing of superstep k is in flight. A delta iteration ends on a balanced
wave with an empty workset everywhere; an unbalanced wave (a message lost or counted
twice) fails the run rather than deciding on a partial superstep.

Superstep checkpoint c is complete when every task reported ``durable >= c``; its
``_metadata`` is written then (the checkpoint then counts for a restore).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from jobmanager.iteration_launch import SparkLauncher, ThreadLauncher
from jobmanager.iteration_result import IterationResult
from jobmanager.termination import Wave
from runtime import control as P
from runtime import superstep_control as S
from runtime.iterations.api import IterationSpec
from runtime.iterations.partition import decode_state
from runtime.iterations.snapshots import SuperstepStore

__all__ = ["AttemptOutcome", "IterationAttempt"]


@dataclass
class AttemptOutcome:
    failure: str | None
    fatal: bool
    current: int  # the superstep in progress (the last one started)
    agreed: int  # the newest superstep every task finished
    solution: dict[Any, Any] = field(default_factory=dict)


class IterationAttempt:
    def __init__(
        self,
        spec: IterationSpec,
        attempt: int,
        start: int,
        router: zmq.Socket[bytes],
        launcher: SparkLauncher | ThreadLauncher,
        kills: list[tuple[int, int]],
        store: SuperstepStore,
        result: IterationResult,
    ) -> None:
        self.spec, self.attempt, self.router, self.launcher = spec, attempt, router, launcher
        self.kills, self.store, self.result = kills, store, result
        self.p = spec.parallelism
        self.current = self.agreed = start
        self.registered: set[int] = set()
        self.done: dict[int, S.SuperstepDone] = {}
        self.states: dict[int, bytes] = {}
        self.lost: set[int] = set()  # failed, or its control connection is gone
        self.killed: set[int] = set()  # told to kill itself (fault injection)
        self.collecting = False
        self.go_at = 0.0
        self.on_first_superstep: Callable[[], None] | None = None
        self.monitor: zmq.Socket[bytes] | None = None
        self.suspect_until = 0.0

    # -- messaging -------------------------------------------------------------------
    def send(self, index: int, msg: P.Message) -> None:
        try:
            self.router.send_multipart(
                [f"{index}:{self.attempt}".encode(), P.encode(msg)], zmq.NOBLOCK
            )
        except zmq.ZMQError:  # EHOSTUNREACH: that task's control socket is gone
            self.lost.add(index)

    def broadcast(self, msg: P.Message) -> None:
        for i in range(self.p):
            if i not in self.lost and i not in self.killed:
                self.send(i, msg)

    def _receive(self, timeout_ms: int) -> Iterator[P.Message]:
        if not self.router.poll(timeout_ms):
            return
        while True:
            try:
                _identity, payload = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            msg = S.decode(payload)
            if getattr(msg, "attempt", self.attempt) == self.attempt:
                yield msg

    # -- the attempt -----------------------------------------------------------------
    def drive(self) -> AttemptOutcome:
        while True:
            failure = self.launcher.failure() or self._dead_tasks()
            if failure is not None:
                return AttemptOutcome(failure, False, self.current, self.agreed)
            for msg in self._receive(20):
                outcome = self._on(msg)
                if outcome is not None:
                    return outcome

    def _dead_tasks(self) -> str | None:
        """A task's control connection closed (its process died): seen within
        milliseconds, long before Spark fails the stage and ends the survivors, which is
        what leaves time for the rescue read. A disconnect event names no task, so each
        task of this attempt is probed: the ROUTER refuses to route to a closed one."""
        if self.monitor is None:
            return None
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self.suspect_until = time.monotonic() + 1.0
        if time.monotonic() >= self.suspect_until or len(self.registered) < self.p:
            return None
        before = set(self.lost)
        for i in range(self.p):
            if i not in self.lost:
                self.send(i, P.Alive())
        dead = sorted(self.lost - before)
        if dead:
            return f"the control connection of task(s) {dead} closed (process died)"
        return None

    def _on(self, msg: P.Message) -> AttemptOutcome | None:
        if isinstance(msg, P.Register):
            self.registered.add(msg.task_index)
            if len(self.registered) == self.p:
                self._go(self.current + 1)
        elif isinstance(msg, S.SuperstepDone) and msg.superstep == self.current:
            self.done[msg.task_index] = msg
            if len(self.done) == self.p:
                return self._decide()
        elif isinstance(msg, S.PartitionState) and self.collecting:
            self.states[msg.task_index] = msg.payload
            if len(self.states) == self.p:
                solution: dict[Any, Any] = {}
                for payload in self.states.values():
                    solution.update(decode_state(payload)[0])
                return AttemptOutcome(None, False, self.current, self.agreed, solution)
        elif isinstance(msg, P.Failed):
            self.lost.add(msg.task_index)
            where = f"task {msg.task_index} (step '{msg.operator}')"
            return AttemptOutcome(f"{where}: {msg.error}", msg.fatal, self.current, self.agreed)
        return None

    def _go(self, k: int) -> None:
        self.current, self.done = k, {}
        self.go_at = time.perf_counter()
        self.result.supersteps_started += 1
        for kill in list(self.kills):
            if kill[1] == k:  # before the Go: the task dies as superstep k starts
                self.kills.remove(kill)
                self.send(kill[0], P.KillSelf(int(signal.SIGKILL), f"superstep:{k}"))
                self.killed.add(kill[0])  # not "lost" yet: its death is detected, not assumed
                break  # one kill per attempt: the next one belongs to the next attempt
        self.broadcast(S.SuperstepGo(k, False))
        if self.on_first_superstep is not None:
            self.on_first_superstep()
            self.on_first_superstep = None

    def _decide(self) -> AttemptOutcome | None:
        k = self.current
        dones = list(self.done.values())
        self.result.superstep_seconds.append((k, time.perf_counter() - self.go_at))
        aggregate = sum(d.aggregate for d in dones)
        active = sum(d.active for d in dones)
        wave = Wave(k, sum(d.sent for d in dones), sum(d.received for d in dones))
        if not wave.balanced:
            where = f"iteration '{self.spec.name}' (step '{self.spec.step.name}')"
            failure = (
                f"{where}: superstep {k} is not balanced: {wave.sent} messages sent, "
                f"{wave.received} received (a message lost or counted twice); not deciding "
                f"on a partial superstep"
            )
            return AttemptOutcome(failure, True, k, self.agreed)
        self.result.aggregates.append((k, aggregate))
        self.agreed = self.result.supersteps = k
        durable = min(d.durable for d in dones)
        if durable >= 0 and (not self.result.checkpoints or durable > self.result.checkpoints[-1]):
            self.store.complete(durable, self.p, self.attempt)
            self.result.checkpoints.append(durable)
        spec = self.spec
        if spec.delta:
            converged = active == 0  # on a balanced wave: nothing of k is in flight
        else:
            converged = spec.converged is not None and spec.converged(aggregate)
        if converged or (spec.max_supersteps is not None and k >= spec.max_supersteps):
            self.result.converged = converged
            self.collecting = True
            self.broadcast(S.SuperstepGo(k, True))
            return None
        self._go(k + 1)
        return None

    # -- recovery ------------------------------------------------------------------
    def rescue(self, superstep: int, timeout: float) -> dict[int, bytes]:
        """Ask every task not known lost for its partition after ``superstep``; return
        the answers that came within ``timeout`` seconds."""
        self.broadcast(S.RescueRequest(superstep))
        answers: dict[int, bytes] = {}
        deadline = time.monotonic() + timeout
        while len(answers) < self.p - len(self.lost | self.killed):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for msg in self._receive(int(left * 1000) + 1):
                if isinstance(msg, S.PartitionState) and msg.superstep == superstep:
                    answers[msg.task_index] = msg.payload
                elif isinstance(msg, P.Failed):
                    self.lost.add(msg.task_index)
        return answers
