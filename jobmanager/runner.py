"""The job manager actor: runs a job as barrier-stage attempts, coordinates its
checkpoints, detects failures, and restarts from the latest completed checkpoint.

One thread (the caller of ``run_job``) owns the ROUTER socket and all state;
Spark's stage runs in a background thread and reports its end through a queue.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import zmq

from channels import control as P
from channels.control import CheckpointFailureReason
from jobmanager import launcher
from jobmanager.coordinator import (
    CheckpointCoordinator,
    CompletedCheckpoint,
)
from jobmanager.faults import DriverKill, resolve_faults
from jobmanager.progress import Progress
from jobmanager.restart import default_strategy
from jobmanager.result import JobResult, Restart
from runtime.config import JobConfig, TaskEnvironment, TaskFault
from runtime.errors import AbsflowError, JobCancelledError, TaskFailedError
from runtime.plan import JobPlan
from runtime.scratch import remove_run
from statebackend.errors import StateError
from statebackend.metadata import CheckpointMetadata
from statebackend.restore import check_compatible
from statebackend.storage import CheckpointStorage

log = logging.getLogger("absflow.jobmanager")

REGISTRATION_TIMEOUT = 120.0


@dataclass
class TaskInfo:
    task_id: str
    pid: int = 0
    host: str = ""
    endpoint: str = ""
    last_seen: float = 0.0
    records_in: int = 0
    records_out: int = 0
    rss: int = 0
    peak_rss: int = 0
    finished: bool = False
    closed: bool = False
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class Failure:
    reason: str
    operator: str | None = None
    subtask: int | None = None
    error: str | None = None
    traceback: str | None = None
    fatal: bool = False  # do not restart (e.g. a bad checkpoint to restore from)


@dataclass
class RestorePoint:
    storage: CheckpointStorage
    checkpoint_id: int
    metadata: CheckpointMetadata


def run_job(
    plan: JobPlan,
    config: JobConfig,
    restore_from: str | None = None,
    faults: list[object] | None = None,
) -> JobResult:
    """Run ``plan`` to completion; raise TaskFailedError when restarts are exhausted."""
    return JobManager(plan, config, restore_from, faults or []).run()


class JobManager:
    def __init__(
        self, plan: JobPlan, config: JobConfig, restore_from: str | None, faults: list[object]
    ) -> None:
        self.plan, self.config = plan, config
        self.driver_kills, self.task_faults = resolve_faults(plan, faults)
        # Strategies count failures: every run gets its own copy of the configured one.
        self.strategy = copy.deepcopy(config.restart_strategy) or default_strategy(
            config.checkpointing
        )
        self.initial_restore: RestorePoint | None = None
        if restore_from is not None:  # first: a bad path must not leave anything behind
            st, n = CheckpointStorage.resolve(restore_from)
            self.initial_restore = RestorePoint(st, n, st.check(n))
            check_compatible(  # before the first attempt: refuse another job's state
                self.initial_restore.metadata,
                plan.step_states(),
                plan.name,
                plan.max_parallelism,
                config.allow_non_restored_state,
            )
        self.owned_dirs: list[str] = []
        self.storage: CheckpointStorage | None = None
        if config.checkpointing:
            root = config.checkpoint_dir
            if root is None:
                root = tempfile.mkdtemp(prefix="absflow-chk-")
                self.owned_dirs.append(root)
            self.storage = CheckpointStorage(root)
        existing = self.storage.completed_checkpoints() if self.storage else []
        restored = self.initial_restore.checkpoint_id if self.initial_restore else 0
        self.next_checkpoint_id = max([0, restored, *existing]) + 1
        self.first_checkpoint_id = self.next_checkpoint_id
        self.completed: list[CompletedCheckpoint] = []
        self.failed_checkpoints: list[dict[str, Any]] = []
        self.committed: dict[tuple[str, int, int], list[Any]] = {}
        self.restarts: list[Restart] = []
        self.kill_times: dict[int, float] = {}
        self.progress = Progress(config.progress)
        self.startup_seconds: float | None = None
        self.task_metrics: dict[str, dict[str, Any]] = {}
        self.records_in = 0
        self.records_out = 0
        self.peak_rss: dict[str, int] = {}
        self.unfired_faults: list[str] = []

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> JobResult:
        try:
            spark = launcher.ensure_session(
                len(self.plan.tasks), self.config, say=self.progress.say
            )
            sc = spark.sparkContext
            launcher.check_slots(
                sc, len(self.plan.tasks), wait=self.config.executor_wait, say=self.progress.say
            )
        except BaseException:
            self._remove_owned_dirs()
            raise
        self.local_hosts = {
            launcher.driver_host(sc),
            "127.0.0.1",
            "localhost",
            socket.gethostname(),
        }
        self.zctx = zmq.Context()
        try:
            self.router = self.zctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            host = launcher.driver_host(sc)
            port = self.router.bind_to_random_port(f"tcp://{host}")
            # A dying task process drops its connection at once: check PIDs on every
            # disconnect instead of waiting ~1 s for Spark to report the failed stage.
            self.monitor = self.router.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        except BaseException:
            self.zctx.destroy(linger=0)
            self._remove_owned_dirs()
            raise
        self.endpoint = f"tcp://{host}:{port}"
        self.run_id = uuid.uuid4().hex[:8]
        started = time.monotonic()
        restore = self.initial_restore
        attempt = 0
        try:
            while True:
                failure = self._run_attempt(spark, attempt, restore, started)
                if failure is None:
                    break
                failed_at = self.kill_times.get(attempt, time.time())
                delay = None if failure.fatal else self.strategy.next_delay()
                if delay is None:
                    raise self._give_up(failure, attempt)
                restore = self._latest_restore_point()
                self.restarts.append(
                    Restart(
                        attempt,
                        failure.reason,
                        restore.checkpoint_id if restore else None,
                        failed_at,
                    )
                )
                self._drop_uncommitted(restore)
                log.warning(
                    "attempt %d failed (%s); restarting from %s in %.2f s",
                    attempt,
                    failure.reason,
                    f"checkpoint {restore.checkpoint_id}" if restore else "the start",
                    delay,
                )
                time.sleep(delay)
                attempt += 1
            return self._result(time.monotonic() - started)
        finally:
            self.progress.close()
            self.router.disable_monitor()
            self.monitor.close(linger=0)
            self.router.close(linger=0)
            self.zctx.term()
            self._remove_owned_dirs()
            remove_run(self.run_id)  # scratch dirs of tasks killed on this host

    def _remove_owned_dirs(self) -> None:
        for d in self.owned_dirs:
            shutil.rmtree(d, ignore_errors=True)

    def _give_up(self, failure: Failure, attempt: int) -> AbsflowError:
        where = ""
        if failure.operator is not None:
            where = f" in operator '{failure.operator}' (subtask {failure.subtask})"
        detail = f"\n{failure.error}" if failure.error else ""
        remote = f"\n--- remote traceback ---\n{failure.traceback}" if failure.traceback else ""
        tried = f" after {attempt} restart(s)" if attempt else ""
        return TaskFailedError(
            f"job '{self.plan.name}' failed{tried}: {failure.reason}{where}; restart strategy: "
            f"{self.strategy.describe()}{detail}{remote}",
            operator=failure.operator,
            subtask=failure.subtask,
            remote_traceback=failure.traceback,
        )

    def _latest_restore_point(self) -> RestorePoint | None:
        """Newest completed checkpoint of this run that verifies; older ones as fallback."""
        if self.storage is not None:
            ids = sorted((c.checkpoint_id for c in self.completed), reverse=True)
            for n in ids:
                try:
                    return RestorePoint(self.storage, n, self.storage.check(n))
                except (StateError, OSError) as err:
                    log.warning(
                        "checkpoint %d cannot be restored (%s); falling back to an older one",
                        n,
                        err,
                    )
        if self.initial_restore is not None:
            r = self.initial_restore
            return RestorePoint(r.storage, r.checkpoint_id, r.storage.check(r.checkpoint_id))
        return None

    def _drop_uncommitted(self, restore: RestorePoint | None) -> None:
        """Output committed after the restored checkpoint is replayed: forget it."""
        limit = restore.checkpoint_id if restore else 0
        for key in [k for k in self.committed if k[2] > limit]:
            del self.committed[key]

    # -- one attempt -------------------------------------------------------------------------
    def _run_attempt(
        self, spark: Any, attempt: int, restore: RestorePoint | None, started: float
    ) -> Failure | None:
        plan, config = self.plan, self.config
        env = TaskEnvironment(
            jm_endpoint=self.endpoint,
            attempt=attempt,
            config=config,
            checkpoint_root=self.storage.root if self.storage else None,
            restore_root=restore.storage.root if restore else None,
            restore_metadata=restore.metadata if restore else None,
            run_id=self.run_id,
            faults=tuple(f for f in self.task_faults if f.attempt == attempt),
        )
        tasks = {t.index: TaskInfo(t.task_id) for t in plan.tasks}
        registered: set[int] = set()
        sources_ended: set[int] = set()
        source_indexes = {t.index for t in plan.source_tasks}
        sink_indexes = self._sink_tasks()
        kills = [k for k in self.driver_kills if k.attempt == attempt]
        submit = time.monotonic()
        first_record_wall: float | None = None
        all_registered_at: float | None = None

        def send(index: int, msg: P.Message) -> None:
            try:
                self.router.send_multipart(
                    [f"{index}:{attempt}".encode(), P.encode(msg)], zmq.NOBLOCK
                )
            except zmq.ZMQError as err:
                log.debug("cannot reach task %d: %s", index, err)

        def on_complete(cp: CompletedCheckpoint) -> None:
            self.completed.append(cp)
            for k in list(kills):
                if (
                    k.after_checkpoint is not None
                    and cp.checkpoint_id >= k.after_checkpoint
                    and not cp.final
                ):
                    self._kill(tasks[k.task_index], attempt, k.signal)
                    kills.remove(k)

        coordinator = CheckpointCoordinator(
            plan, config, self.storage, send, self.next_checkpoint_id, attempt, on_complete
        )
        stage = launcher.StageRunner(spark, plan, env, f"absflow-{self.run_id}-{attempt}").start()
        failure: Failure | None = None
        stage_done_at: float | None = None
        try:
            while True:
                for msg in self._receive(20):
                    if getattr(msg, "attempt", attempt) != attempt:
                        continue  # a straggler of a failed attempt
                    failure = self._handle(
                        msg, tasks, registered, sources_ended, source_indexes, coordinator, send
                    )
                    if failure is not None:
                        return failure
                if self.monitor.poll(0):
                    while self.monitor.poll(0):
                        self.monitor.recv_multipart()
                    dead = [
                        t
                        for t in tasks.values()
                        if t.pid
                        and t.host in self.local_hosts
                        and not t.closed
                        and not _alive(t.pid)
                    ]
                    if dead:
                        return Failure(f"task {dead[0].task_id} (pid {dead[0].pid}) died")
                now = time.monotonic()
                if all_registered_at is None and len(registered) == len(tasks):
                    all_registered_at = now
                    log.info(
                        "attempt %d: all %d tasks registered %.3f s after submit",
                        attempt,
                        len(tasks),
                        now - submit,
                    )
                    coordinator.started = now
                    coordinator.last_completion = now
                if first_record_wall is None:
                    firsts = [t.metrics.get("first_record_at", 0.0) for t in tasks.values()]
                    firsts = [f for f in firsts if f]
                    if firsts:
                        first_record_wall = min(firsts)
                        if attempt == 0 and self.startup_seconds is None:
                            self.startup_seconds = first_record_wall - (
                                time.time() - (now - submit)
                            )
                        if self.restarts and self.restarts[-1].resumed_at is None:
                            self.restarts[-1].resumed_at = first_record_wall
                if all(t.finished for t in tasks.values()):
                    stage.join(10.0)
                    self.next_checkpoint_id = coordinator.next_id
                    self._collect_metrics(tasks)
                    for k in kills:
                        registered_for = (
                            f"{now - all_registered_at:.2f} s after all tasks registered"
                            if all_registered_at is not None
                            else "before all tasks registered"
                        )
                        self.unfired_faults.append(
                            f"{k} in attempt {attempt}: the attempt finished first, {registered_for}, "
                            f"{len(coordinator.completed)} checkpoint(s) completed"
                        )
                        log.warning("fault did not fire: %s", self.unfired_faults[-1])
                    return None
                if all_registered_at is not None:
                    coordinator.on_tick()
                    if coordinator.final_failed is not None:
                        f = coordinator.final_failed
                        return Failure(
                            f"the final checkpoint {f.checkpoint_id} failed "
                            f"({f.reason.name}: {f.detail})"
                        )
                    if coordinator.too_many_failures:
                        return Failure(
                            f"{coordinator.consecutive_failures} consecutive checkpoint failures "
                            f"(tolerable_checkpoint_failures={config.tolerable_checkpoint_failures})"
                        )
                    for k in list(kills):
                        if (
                            k.after_seconds is not None
                            and now - all_registered_at >= k.after_seconds
                        ):
                            self._kill(tasks[k.task_index], attempt, k.signal)
                            kills.remove(k)
                    for t in tasks.values():
                        if not t.finished and now - t.last_seen > config.heartbeat_timeout:
                            return Failure(
                                f"task {t.task_id} stopped heart-beating "
                                f"for {config.heartbeat_timeout:.0f} s"
                            )
                elif now - submit > REGISTRATION_TIMEOUT:
                    missing = [tasks[i].task_id for i in tasks if i not in registered]
                    return Failure(
                        f"tasks {missing} did not start within {REGISTRATION_TIMEOUT:.0f} s",
                        fatal=True,
                    )
                if stage_done_at is None and not stage.outcome.empty():
                    err = stage.outcome.get()
                    stage_done_at = now
                    if err is not None:
                        return Failure(
                            launcher.describe_stage_error(err), error=_first_lines(str(err))
                        )
                if stage_done_at is not None and now - stage_done_at > 5.0:
                    return Failure("the barrier stage ended before every task finished")
                if config.timeout is not None and now - started > config.timeout:
                    return Failure(
                        f"the job ran longer than timeout={config.timeout} s", fatal=True
                    )
                self.progress.update(
                    sum(tasks[i].records_in for i in source_indexes),
                    sum(tasks[i].records_out for i in sink_indexes),
                    len(self.completed),
                    len(self.restarts),
                    self.completed[-1].duration_ms if self.completed else None,
                )
        except KeyboardInterrupt:
            failure = Failure("cancelled by the user (Ctrl-C)", fatal=True)
            raise JobCancelledError(f"job '{plan.name}' was cancelled") from None
        finally:
            # Totals over all attempts: records replayed after a restore count again.
            self.records_in += sum(tasks[i].records_in for i in source_indexes)
            self.records_out += sum(tasks[i].records_out for i in sink_indexes)
            self.next_checkpoint_id = max(self.next_checkpoint_id, coordinator.next_id)
            if failure is not None or not all(t.finished for t in tasks.values()):
                coordinator.abort_all(CheckpointFailureReason.TASK_FAILURE)
                self._end_attempt(stage, tasks, send, attempt)
            self.failed_checkpoints.extend(
                {"checkpoint_id": f.checkpoint_id, "reason": f.reason.name, "detail": f.detail}
                for f in coordinator.failed
            )

    def _sink_tasks(self) -> list[int]:
        from runtime.graph import StepKind

        return [
            t.index for t in self.plan.tasks if self.plan.chain_steps(t)[-1].kind is StepKind.SINK
        ]

    def _handle(
        self,
        msg: P.Message,
        tasks: dict[int, TaskInfo],
        registered: set[int],
        sources_ended: set[int],
        source_indexes: set[int],
        coordinator: CheckpointCoordinator,
        send: Any,
    ) -> Failure | None:
        now = time.monotonic()
        if isinstance(msg, P.Heartbeat):
            t = tasks[msg.task_index]
            t.last_seen = now
            t.records_in, t.records_out, t.rss = msg.records_in, msg.records_out, msg.rss_bytes
            t.peak_rss = max(t.peak_rss, msg.rss_bytes)
            if msg.first_record_at and "first_record_at" not in t.metrics:
                t.metrics["first_record_at"] = msg.first_record_at
            send(msg.task_index, P.Alive())
        elif isinstance(msg, P.SinkOutput):
            self.committed.setdefault((msg.step, msg.subtask, msg.checkpoint_id), list(msg.records))
        elif isinstance(msg, P.Ack):
            tasks[msg.task_index].last_seen = now
            coordinator.on_ack(msg)
        elif isinstance(msg, P.Decline):
            coordinator.on_decline(msg)
        elif isinstance(msg, P.Register):
            t = tasks[msg.task_index]
            t.pid, t.host, t.endpoint, t.last_seen = msg.pid, msg.host, msg.endpoint, now
            registered.add(msg.task_index)
        elif isinstance(msg, P.SourceEnded):
            sources_ended.add(msg.task_index)
            if sources_ended >= source_indexes:
                coordinator.on_sources_ended()
        elif isinstance(msg, P.Finished):
            t = tasks[msg.task_index]
            t.finished = True
            t.metrics.update(msg.metrics)
            t.records_in = msg.metrics.get("records_in", t.records_in)
            t.records_out = msg.metrics.get("records_out", t.records_out)
        elif isinstance(msg, P.Closed):
            tasks[msg.task_index].closed = True
        elif isinstance(msg, P.Failed):
            return Failure(
                "a user function raised"
                if msg.operator != tasks[msg.task_index].task_id
                else "a task failed",
                operator=msg.operator,
                subtask=msg.subtask,
                error=msg.error,
                traceback=msg.traceback,
                fatal=msg.fatal,
            )
        return None

    def _kill(self, task: TaskInfo, attempt: int, sig: int = signal.SIGKILL) -> None:
        """Fault injection: a real SIGKILL (or SIGSTOP) of a task process."""
        if not task.pid:
            log.warning("fault injection: task %s has not registered; no kill", task.task_id)
            return
        if task.host not in self.local_hosts:
            raise AbsflowError(
                f"cannot kill task {task.task_id} on host {task.host}: "
                "kill faults need the task processes on the driver's machine"
            )
        log.warning(
            "fault injection: %s task %s (pid %d)", signal.Signals(sig).name, task.task_id, task.pid
        )
        self.kill_times.setdefault(attempt, time.time())
        with contextlib.suppress(ProcessLookupError):
            os.kill(task.pid, sig)

    def _receive(self, timeout_ms: int) -> Iterator[P.Message]:
        """Every message waiting on the ROUTER, after waiting up to ``timeout_ms`` for one."""
        if not self.router.poll(timeout_ms):
            return
        while True:
            try:
                _ident, frame = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            yield P.decode(frame)

    def _drain_closed(self, tasks: dict[int, TaskInfo], attempt: int) -> None:
        for msg in self._receive(10):
            if isinstance(msg, P.Closed) and msg.attempt == attempt:
                tasks[msg.task_index].closed = True

    def _end_attempt(
        self, stage: launcher.StageRunner, tasks: dict[int, TaskInfo], send: Any, attempt: int
    ) -> None:
        """Stop every task of a failed attempt and wait until its processes and ports are gone."""
        for index in tasks:
            send(index, P.Cancel("the attempt failed"))
        # Survivors close their sockets and return their process to Spark's worker pool
        # (a reused worker starts the next attempt ~1 s sooner than a fresh one).
        local = [t for t in tasks.values() if t.pid and t.host in self.local_hosts]
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline and any(not t.closed and _alive(t.pid) for t in local):
            self._drain_closed(tasks, attempt)
        for t in local:
            if not t.closed and _alive(t.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(t.pid, signal.SIGKILL)
        log.info("attempt cancelled; survivors ended")
        stage.cancel()
        if not stage.join(30.0):
            log.warning("the barrier stage of the failed attempt did not end within 30 s")
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and (
            any(not t.closed and _alive(t.pid) for t in local)
            or any(_port_in_use(t.endpoint) for t in local)
        ):
            time.sleep(0.02)
        log.info("attempt ended: stage done, processes and ports gone")

    def _collect_metrics(self, tasks: dict[int, TaskInfo]) -> None:
        for t in tasks.values():
            self.task_metrics[t.task_id] = dict(t.metrics)
            self.peak_rss[t.task_id] = max(t.peak_rss, int(t.metrics.get("peak_rss", 0)))

    def _result(self, duration: float) -> JobResult:
        from runtime.graph import StepKind
        from runtime.sinks import CollectSink

        outputs: dict[str, list[Any]] = {}
        for step in self.plan.steps:
            if step.kind is StepKind.SINK and isinstance(step.fn, CollectSink):
                outputs[step.name] = []  # present even when empty
        for (step_name, _subtask, _n), records in sorted(
            self.committed.items(), key=lambda kv: (kv[0][2], kv[0][1])
        ):
            outputs.setdefault(step_name, []).extend(records)
        owned = self.storage is not None and self.storage.root in self.owned_dirs
        return JobResult(
            name=self.plan.name,
            outputs=outputs,
            duration=duration,
            records_in=self.records_in,
            records_out=self.records_out,
            startup_seconds=self.startup_seconds,
            restarts=self.restarts,
            checkpoints=[
                {
                    "checkpoint_id": c.checkpoint_id,
                    "final": c.final,
                    "duration_ms": c.duration_ms,
                    **c.metrics,
                }
                for c in self.completed
            ],
            failed_checkpoints=self.failed_checkpoints,
            peak_rss=self.peak_rss,
            checkpoint_dir=None if owned or self.storage is None else self.storage.root,
            task_metrics=self.task_metrics,
            unfired_faults=self.unfired_faults,
        )


def _first_lines(text: str, n: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[:n])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _port_in_use(endpoint: str) -> bool:
    if not endpoint.startswith("tcp://"):
        return False
    host, _, port = endpoint[6:].rpartition(":")
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind((host, int(port)))
        return False
    except OSError:
        return True
    finally:
        probe.close()


__all__ = ["DriverKill", "JobManager", "TaskFault", "run_job"]
