"""The job manager of a superstep iteration: starts the tasks, runs the per-superstep
agreement of all loop heads, completes superstep checkpoints, and recovers failures
(seed 004): optimistic (rescue the survivors' partitions before ending them, rebuild the
lost ones with the compensation function, go on from the agreed superstep) or
pessimistic (the last complete superstep checkpoint), falling back to the start when
neither is possible, and saying so in the result.

A kill of the driver itself is out of scope: the agreement, the rescued state and the
checkpoint metadata live in this process.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import zmq

from jobmanager.iteration_attempt import AttemptOutcome, IterationAttempt
from jobmanager.iteration_launch import SparkLauncher, ThreadLauncher
from jobmanager.iteration_result import IterationResult, RecoveryRecord
from runtime import control as P
from runtime.errors import TaskFailedError
from runtime.iterations.api import IterationError, IterationSpec
from runtime.iterations.partition import decode_state
from runtime.iterations.snapshots import SuperstepStore, write_whole
from runtime.iterations.worker import WorkerContext

__all__ = ["IterationDriver"]

State = tuple[dict[Any, Any], set[Any] | None]


def _recorder(result: IterationResult, record: RecoveryRecord, seen: float) -> Callable[[], None]:
    """Record the recovery when the next attempt starts its first superstep (so its
    ``seconds`` cover ending the failed attempt, compensation and the restart)."""

    def done() -> None:
        result.recoveries.append(replace(record, seconds=time.perf_counter() - seen))

    return done


class IterationDriver:
    def __init__(
        self,
        spec: IterationSpec,
        solution: dict[Any, Any],
        workset: set[Any],
        side_parts: list[dict[Any, Any]],
        launcher: str,
        say: Callable[[str], None] | None,
    ) -> None:
        self.spec, self.launcher = spec, launcher
        self.say = say or (lambda _msg: None)
        self.solution, self.workset = solution, (workset if spec.delta else None)
        self.side_parts = side_parts
        self.side = {k: v for part in side_parts for k, v in part.items()}
        self.keys_by_part: list[frozenset[Any]] = [
            frozenset(p) for p in spec.partitioner.split(dict.fromkeys(solution))
        ]
        self.where = f"iteration '{spec.name}' (step '{spec.step.name}')"
        self.monitor: zmq.Socket[bytes] | None = None

    # -- the run --------------------------------------------------------------------
    def run(self, kills: list[tuple[int, int]]) -> IterationResult:
        rec = self.spec.recovery
        owned = rec.checkpoint_dir is None
        base = SuperstepStore(self._run_root(rec.checkpoint_dir), rec.storage_options)
        self.base = base
        self.checkpoints = self._store("checkpoints")
        side = self._store("side")
        for i, part in enumerate(self.side_parts):
            write_whole(side, 0, i, part, None).wait()
        zctx = zmq.Context()
        router = zctx.socket(zmq.ROUTER)
        try:
            spark = None
            host = "127.0.0.1"
            if self.launcher == "spark":
                from jobmanager.launcher import check_slots, driver_host, ensure_session
                from runtime.config import JobConfig

                spark = ensure_session(self.spec.parallelism, JobConfig(), say=self.say)
                check_slots(spark.sparkContext, self.spec.parallelism, say=self.say)
                host = driver_host(spark.sparkContext)
            router.setsockopt(zmq.LINGER, 0)
            router.setsockopt(zmq.ROUTER_MANDATORY, 1)
            router.setsockopt(zmq.SNDHWM, 0)  # never EAGAIN: a refused send means a lost task
            port = router.bind_to_random_port(f"tcp://{host}")
            self.monitor = router.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            return self._attempts(router, f"tcp://{host}:{port}", spark, list(kills))
        finally:
            if self.monitor is not None:
                router.disable_monitor()
                self.monitor.close(0)
            router.close(0)
            zctx.term()
            if owned:
                shutil.rmtree(base.root, ignore_errors=True)

    def _run_root(self, checkpoint_dir: str | None) -> str:
        """A directory of this run's own: a new temp dir, one under a local
        ``checkpoint_dir``, or a new prefix under a storage URL (``s3://...``)."""
        prefix = f"absflow-iter-{self.spec.name}-"
        if checkpoint_dir is not None and "://" in checkpoint_dir:
            if not checkpoint_dir.startswith("file://"):
                return f"{checkpoint_dir.rstrip('/')}/{prefix}{uuid.uuid4().hex[:8]}"
            checkpoint_dir = checkpoint_dir[len("file://") :]
        if checkpoint_dir is not None:
            os.makedirs(checkpoint_dir, exist_ok=True)
        return tempfile.mkdtemp(prefix=prefix, dir=checkpoint_dir)

    def _store(self, name: str) -> SuperstepStore:
        """The store ``name`` under this run's root (its path is what tasks are told)."""
        return SuperstepStore(
            self.base.fs.join(self.base.root, name), self.spec.recovery.storage_options
        )

    def _attempts(
        self,
        router: zmq.Socket[bytes],
        jm: str,
        spark: Any,
        kills: list[tuple[int, int]],
    ) -> IterationResult:
        rec = self.spec.recovery
        started = time.perf_counter()
        result = IterationResult(self.spec.name, {}, 0, False, 0, 0.0, 0, rec.mode)
        if rec.checkpoint_dir is not None:
            result.checkpoint_root = self.checkpoints.root
        start, input_root = 0, self._store("input-0").root
        self._write_input(input_root, 0, (self.solution, self.workset))
        pending_recovery: tuple[RecoveryRecord, float] | None = None
        for attempt in range(rec.max_restarts + 1):
            result.attempts = attempt + 1
            contexts = [
                WorkerContext(
                    i,
                    attempt,
                    start,
                    input_root,
                    self._store("side").root,
                    self.checkpoints.root,
                    jm,
                    "127.0.0.1",
                )
                for i in range(self.spec.parallelism)
            ]
            launcher: SparkLauncher | ThreadLauncher
            if spark is not None:
                launcher = SparkLauncher(spark, self.spec, contexts).start()
            else:
                launcher = ThreadLauncher(self.spec, contexts).start()
            run = IterationAttempt(
                self.spec, attempt, start, router, launcher, kills, self.checkpoints, result
            )
            run.monitor = self.monitor
            if pending_recovery is not None:
                run.on_first_superstep = _recorder(result, *pending_recovery)
            outcome = run.drive()
            if outcome.failure is None:
                self._end(router, launcher, run)
                result.solution = outcome.solution
                result.seconds = time.perf_counter() - started
                return result
            seen = time.perf_counter()
            self.say(
                f"{self.where}: attempt {attempt + 1} failed during superstep {outcome.current}: {outcome.failure}"
            )
            if outcome.fatal:
                self._end(router, launcher, run)
                raise IterationError(f"{self.where} failed: {outcome.failure}")
            record, state, from_checkpoint = self._recover(run, outcome)
            self._end(router, launcher, run)
            pending_recovery = (record, seen)
            start = record.resumed_from
            if from_checkpoint:
                input_root = self.checkpoints.root
            else:
                input_root = self._store(f"input-{attempt + 1}").root
                self._write_input(input_root, start, state)
        raise TaskFailedError(
            f"{self.where} failed {rec.max_restarts + 1} times; raise Recovery(max_restarts=...) "
            f"or look at the failures above"
        )

    def _end(
        self,
        router: zmq.Socket[bytes],
        launcher: SparkLauncher | ThreadLauncher,
        run: IterationAttempt,
    ) -> None:
        run.broadcast(P.Cancel("attempt ended"))
        launcher.cancel()
        if not launcher.join(30.0):
            self.say(f"{self.where}: tasks of attempt {run.attempt + 1} did not end within 30 s")

    def _write_input(self, root: str, superstep: int, state: State) -> None:
        solution, workset = state
        store = SuperstepStore(root, self.spec.recovery.storage_options)
        parts = self.spec.partitioner.split(solution)
        for i, part in enumerate(parts):
            ws = (
                None
                if workset is None
                else {k for k in workset if self.spec.partitioner.owner(k) == i}
            )
            write_whole(store, superstep, i, part, ws).wait()

    # -- recovery -------------------------------------------------------------------
    def _recover(
        self, run: IterationAttempt, outcome: AttemptOutcome
    ) -> tuple[RecoveryRecord, State, bool]:
        rec = self.spec.recovery
        failed, agreed = outcome.current, outcome.agreed
        note = ""
        lost: tuple[int, ...] = ()
        if rec.mode == "optimistic":
            rescued = run.rescue(agreed, rec.rescue_timeout)
            lost = tuple(i for i in range(self.spec.parallelism) if i not in rescued)
            if not rescued:
                note = "no surviving task answered the rescue read"
            elif len(lost) > rec.max_lost_fraction * self.spec.parallelism:
                note = f"{len(lost)} of {self.spec.parallelism} partitions lost: more than compensation should rebuild"
            elif not lost:
                note = "every task answered the rescue read; nothing to compensate"
                state = self._merge(rescued.values())
                return (
                    RecoveryRecord(failed, "optimistic", agreed, (), outcome.failure or "", note),
                    state,
                    False,
                )
            else:
                state, mass = self._compensate(rescued, lost)
                return (
                    RecoveryRecord(
                        failed, "optimistic", agreed, lost, outcome.failure or "", "", mass
                    ),
                    state,
                    False,
                )
            note += "; falling back to " + (
                "the last superstep checkpoint"
                if self.checkpoints.latest() is not None
                else "the start"
            )
        latest = self.checkpoints.latest()
        if latest is not None and rec.mode != "none":
            return (
                RecoveryRecord(failed, "checkpoint", latest, lost, outcome.failure or "", note),
                ({}, None),
                True,
            )
        return (
            RecoveryRecord(failed, "start", 0, lost, outcome.failure or "", note),
            (self.solution, self.workset),
            False,
        )

    @staticmethod
    def _merge(parts: Any) -> State:
        solution: dict[Any, Any] = {}
        workset: set[Any] | None = None
        for payload in parts:
            sol, ws = decode_state(payload)
            solution.update(sol)
            if ws is not None:
                workset = (workset or set()) | ws
        return solution, workset

    def _compensate(
        self, rescued: dict[int, bytes], lost: tuple[int, ...]
    ) -> tuple[State, float | None]:
        fn = self.spec.recovery.compensation
        assert fn is not None
        surviving, workset = self._merge(rescued.values())
        lost_keys = frozenset().union(*(self.keys_by_part[i] for i in lost))
        out = fn(surviving, lost_keys, self.side)
        name = getattr(fn, "__name__", repr(fn))
        if self.spec.delta:
            if not (isinstance(out, tuple) and len(out) == 2):
                raise IterationError(
                    f"{self.where}: compensation '{name}' must return (values, workset additions) for a delta iteration"
                )
            values, additions = out
        else:
            values, additions = out, set()
        if set(values) != lost_keys:
            missing, extra = lost_keys - set(values), set(values) - lost_keys
            raise IterationError(
                f"{self.where}: compensation '{name}' must return exactly the lost keys "
                f"({len(lost_keys)} of partitions {list(lost)}); missing {sorted(map(repr, missing))[:5]}, "
                f"unexpected {sorted(map(repr, extra))[:5]}"
            )
        unknown = set(additions) - surviving.keys() - lost_keys
        if unknown:
            raise IterationError(
                f"{self.where}: compensation '{name}' added unknown keys to the workset: {sorted(map(repr, unknown))[:5]}"
            )
        solution = {**surviving, **values}
        if self.spec.delta:
            workset = (workset or set()) | set(additions)
        mass = None
        if values and all(isinstance(v, float) for v in values.values()):
            mass = float(sum(solution.values()))
        return (solution, workset), mass
