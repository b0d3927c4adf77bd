"""The job manager: runs a job as barrier-stage attempts (``jobmanager.attempt``) and,
when one fails, restarts the job from the latest completed checkpoint under the
restart strategy, unless the failure is one a restart cannot fix.

One thread (the caller of ``run_job``) owns the ROUTER socket and all state; each
attempt's stage (a Spark barrier stage, or local task processes: ``jobmanager.launchers``)
runs in a background thread and reports its end through a queue.
"""

from __future__ import annotations

import copy
import errno
import functools
import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import zmq

from channels.security import ChannelKeys, Guard
from jobmanager.attempt import Attempt
from jobmanager.failures import Failure, FailureHistory, restore_point_words
from jobmanager.fault_schedule import FaultSchedule
from jobmanager.faults import DriverKill, relative_to_run, resolve_faults
from jobmanager.launchers import Launcher, select_launcher
from jobmanager.liveness import Liveness, ctrl_c_deferred
from jobmanager.metrics import CommittedOutputs, RunMetrics
from jobmanager.optimistic import Compensator, OptimisticRun, RescueOutcome
from jobmanager.progress import Progress
from jobmanager.restart import default_strategy
from jobmanager.result import JobResult, Restart
from jobmanager.router_link import RouterLink, open_router
from jobmanager.services import RunServices
from jobmanager.stop import JobEntry, StopRequest, stop_signals
from jobmanager.supersteps import superstep_step
from jobmanager.web import Dashboard
from runtime.config import JobConfig
from runtime.errors import (
    AbsflowError,
    CheckpointStorageError,
    InsufficientSlotsError,
    JobCancelledError,
    TaskFailedError,
)
from runtime.graph import StepKind
from runtime.plan import JobPlan
from runtime.scratch import remove_run
from runtime.snapshot_modes import redistributable_logs
from runtime.task_environment import TaskEnvironment, TaskFault
from statebackend.errors import StateError, StorageAccessError
from statebackend.metadata import CheckpointMetadata
from statebackend.restore import check_compatible
from statebackend.shared import SharedStateRegistry
from statebackend.storage import CheckpointStorage

log = logging.getLogger("absflow.jobmanager")


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
    for step in plan.steps:  # connects (explain/validate stay offline): servers up, tables fit
        if step.kind is StepKind.SINK:
            step.fn.check_system(step.name)
    return JobManager(plan, config, restore_from, faults or []).run()


class JobManager:
    """Runs one job: attempt after attempt until one finishes, the restart strategy gives
    up, or a failure cannot be fixed by a restart. ``run()`` is called once."""

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
            st, n = CheckpointStorage.resolve(restore_from, config.storage_options)
            self.initial_restore = RestorePoint(st, n, st.check(n))
            check_compatible(  # before the first attempt: refuse another job's state
                self.initial_restore.metadata,
                plan.step_states(),
                plan.name,
                plan.max_parallelism,
                config.allow_non_restored_state,
                redistributable_logs(plan),
            )
        self.owned_dirs: list[str] = []
        self.storage: CheckpointStorage | None = None
        if config.checkpointing:
            root = config.checkpoint_dir
            if root is None:
                root = tempfile.mkdtemp(prefix="absflow-chk-")
                self.owned_dirs.append(root)
            self.storage = open_checkpoint_storage(root, config.storage_options)
        existing = self.storage.completed_checkpoints() if self.storage else []
        restored = self.initial_restore.checkpoint_id if self.initial_restore else 0
        self.next_checkpoint_id = max([0, restored, *existing]) + 1
        self.first_checkpoint_id = self.next_checkpoint_id
        self.task_faults = relative_to_run(self.task_faults, self.first_checkpoint_id)
        self.metrics = RunMetrics(plan)
        self.outputs = CommittedOutputs(plan, restored)
        self.faults = FaultSchedule(self.driver_kills)
        self.history = FailureHistory()
        self.progress = Progress(config.progress)
        self.stop = StopRequest()  # _run() replaces it with one the CLI can reach
        settings = config.optimistic_recovery
        self.optimistic = OptimisticRun(settings) if settings is not None else None

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> JobResult:
        """Run the job to completion. Raises TaskFailedError when it fails for good, and
        JobCancelledError on Ctrl-C (after its tasks, ports and temp dirs are gone)."""
        try:
            return self._run()
        except KeyboardInterrupt:
            raise JobCancelledError(
                f"job '{self.plan.name}' was cancelled (Ctrl-C); its tasks were ended"
            ) from None

    def _run(self) -> JobResult:
        try:
            self.launcher = select_launcher(self.config)
            self.launcher.prepare(len(self.plan.tasks), self.config, say=self.progress.say)
        except BaseException:
            self._remove_owned_dirs()
            raise
        secure = self.config.secures_channels(self.launcher.remote)
        self.keys = ChannelKeys.generate() if secure else None
        self.zctx = zmq.Context()
        try:
            self.guard = Guard(self.zctx, self.keys, "the job manager") if self.keys else None
            self.router, self.monitor, port = open_router(self.zctx, self.launcher.host, self.guard)
        except BaseException:
            self.zctx.destroy(linger=0)
            self._remove_owned_dirs()
            raise
        self.endpoint = f"tcp://{self.launcher.host}:{port}"
        self.metrics.refused = self._refused_connections
        entry = JobEntry(self.plan.name, self.storage.root if self.storage else None)
        try:
            self.run_id = uuid.uuid4().hex[:8]
            self.stop = StopRequest(entry.stop_file)
            dashboard = Dashboard(self.plan, self.config, self.metrics)
            url = dashboard.open(self.progress.say)
            if url is not None:
                self.progress.announce(f"job '{self.plan.name}': dashboard at {url}")
                self.progress.ui_url = url
            self.services = RunServices(
                link=RouterLink(self.router, self.run_id),
                liveness=Liveness(
                    self.launcher.local_hosts, self.config.heartbeat_timeout, self.monitor
                ),
                faults=self.faults,
                metrics=self.metrics,
                outputs=self.outputs,
                progress=self.progress,
                dashboard=dashboard,
                stop=self.stop,
            )
            try:
                with entry, stop_signals(self.stop, self.plan.name):
                    result = self._attempts(self.launcher, time.monotonic())
            except BaseException as err:
                dashboard.finish("failed", f"{type(err).__name__}: {err}")
                raise
            dashboard.finish("finished")
            result.ui_url = dashboard.url
            return result
        finally:
            with ctrl_c_deferred():
                self.launcher.close()
                self.progress.close()
                self.router.disable_monitor()
                self.monitor.close(linger=0)
                self.router.close(linger=0)
                if self.guard is not None:
                    self.guard.close()
                self.zctx.term()
                self._remove_owned_dirs()
                remove_run(self.run_id)  # scratch dirs of tasks killed on this host

    def _attempts(self, launcher: Launcher, started: float) -> JobResult:
        """The attempt loop across restarts."""
        restore = self.initial_restore
        number = 0
        while True:
            self.faults.start_attempt(number)
            self.metrics.start_attempt(restore.checkpoint_id if restore else None)
            attempt = self._run_attempt(launcher, number, restore, started)
            failure = attempt.failure
            if failure is None:
                break
            failed_at = attempt.killed_at or time.time()
            restore, delay = self._recover(failure, number, restore, failed_at, attempt.rescue)
            time.sleep(delay)
            number += 1
            self.services.dashboard.restarting(
                f"attempt {number - 1} failed ({failure.describe()}); attempt {number} "
                f"starts once the cluster has {len(self.plan.tasks)} task slots"
            )
            try:
                launcher.before_restart(
                    len(self.plan.tasks),
                    self.config,
                    say=functools.partial(self._waiting_for_slots, number),
                )
            except InsufficientSlotsError as err:
                raise InsufficientSlotsError(
                    f"job '{self.plan.name}' cannot restart after attempt {number - 1} failed "
                    f"({failure.describe()}): {err}"
                ) from err
        now = time.monotonic()
        unfired = self.faults.unfired(now, self.metrics.checkpoints_completed)
        for note in unfired:
            log.warning("fault did not fire: %s", note)
        savepoint = self._savepoint()
        owned = self.storage is not None and self.storage.root in self.owned_dirs
        result = self.metrics.result(
            self.plan.name,
            self.outputs.outputs(),
            now - started,
            None if owned or self.storage is None else self.storage.root,
            unfired,
        )
        result.stopped = self.stop.reason is not None and (
            savepoint is not None or not self.config.checkpointing
        )
        result.savepoint = savepoint
        return result

    def _waiting_for_slots(self, attempt: int, text: str) -> None:
        """What the slot check before a restart says: a warning, and on the dashboard."""
        self.services.dashboard.restarting(text)
        self.progress.say(f"job '{self.plan.name}', attempt {attempt}: {text}", logging.WARNING)

    def _savepoint(self) -> str | None:
        """The savepoint this run ended with (the path of its chk-<n>), or None. One in a
        temp checkpoint root the run created is kept: it is the user's only copy."""
        done = self.metrics.completed
        if self.storage is None or not done or not done[-1].savepoint:
            return None
        if self.storage.root in self.owned_dirs:
            self.owned_dirs.remove(self.storage.root)
            log.warning(
                "the savepoint is in the temporary checkpoint root %s (kept); pass "
                "checkpoint_dir= to choose where savepoints go",
                self.storage.root,
            )
        path = self.storage.location(done[-1].checkpoint_id)
        log.warning("job '%s' stopped with savepoint %s", self.plan.name, path)
        return path

    def _recover(
        self,
        failure: Failure,
        number: int,
        restore: RestorePoint | None,
        failed_at: float,
        rescue: RescueOutcome | None = None,
    ) -> tuple[RestorePoint | None, float]:
        """After attempt ``number`` (which restored ``restore``) failed: the restore point
        and delay of the next attempt; raises TaskFailedError when there is none.
        ``rescue``: an iteration's optimistic recovery, the failed attempt's rescue
        snapshot (or why it has none): `_optimistic_restore` decides."""
        restored = restore.checkpoint_id if restore else None
        if failure.permanent is not None:
            raise self._give_up(failure, number, f"not retried: {failure.permanent}")
        earlier = self.history.repeated(failure, restored)
        if earlier is not None:
            raise self._give_up(
                earlier,
                number,
                f"it failed the same way twice after "
                f"{'restoring' if restored is not None else 'starting from'} "
                f"{restore_point_words(restored)}: not retried, a restart cannot fix it",
            )
        delay = self.strategy.next_delay()
        if delay is None:
            raise self._give_up(
                failure, number, f"restart strategy gave up: {self.strategy.describe()}"
            )
        restore = self._latest_restore_point()
        if rescue is not None:
            restore = self._optimistic_restore(rescue, restore)
        restored = restore.checkpoint_id if restore else None
        self.metrics.restarts.append(
            Restart(
                number,
                failure.cause,
                failure.describe(),
                restored,
                failed_at,
                error=failure.error,
            )
        )
        self.outputs.drop_after(restored)
        rescue_record = restore.metadata.rescue if restore is not None else None
        log.warning(
            "attempt %d failed (%s); restarting from %s in %.2f s",
            number,
            failure.describe(),
            restore_point_words(restored)
            + (f" (a {rescue_record.describe()})" if rescue_record is not None else ""),
            delay,
        )
        return restore, delay

    def _optimistic_restore(
        self, rescue: RescueOutcome, newest: RestorePoint | None
    ) -> RestorePoint | None:
        """Optimistic recovery: the failed attempt's rescue snapshot, else the newest of an
        earlier rescue and ``newest`` (``jobmanager.optimistic.OptimisticRun``); the
        iteration's record says how the next attempt recovers."""
        assert self.optimistic is not None and self.storage is not None
        metadata, planned = self.optimistic.next_restore(
            rescue, newest.metadata if newest is not None else None
        )
        if self.metrics.iteration is not None:
            self.metrics.iteration.planned = planned
        if metadata is None:
            return None
        if newest is not None and metadata.checkpoint_id == newest.checkpoint_id:
            return newest
        return RestorePoint(self.storage, metadata.checkpoint_id, metadata)

    def _refused_connections(self) -> int:
        """Connections the driver's sockets refused (job manager and rendezvous)."""
        own = self.guard.refused if self.guard is not None else 0
        return own + self.launcher.refused_connections

    def _remove_owned_dirs(self) -> None:
        for d in self.owned_dirs:
            shutil.rmtree(d, ignore_errors=True)

    def _give_up(self, failure: Failure, number: int, why: str) -> AbsflowError:
        detail = f"\n{failure.error}" if failure.error and "\n" in failure.error.strip() else ""
        remote = f"\n--- remote traceback ---\n{failure.traceback}" if failure.traceback else ""
        tried = f" after {number} restart(s)" if number else ""
        return TaskFailedError(
            f"job '{self.plan.name}' failed{tried}: {failure.describe()}; {why}{detail}{remote}",
            operator=failure.operator,
            subtask=failure.subtask,
            remote_traceback=failure.traceback,
        )

    def _latest_restore_point(self) -> RestorePoint | None:
        """Newest completed checkpoint of this run that verifies; older ones as fallback."""
        if self.storage is not None:
            ids = sorted((c.checkpoint_id for c in self.metrics.completed), reverse=True)
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

    # -- one attempt -----------------------------------------------------------------------
    def _run_attempt(
        self, launcher: Launcher, attempt: int, restore: RestorePoint | None, started: float
    ) -> Attempt:
        """Run attempt ``attempt`` to its end; its ``failure`` is None when it finished."""
        plan, config = self.plan, self.config
        if self.storage is not None:  # no task runs: chain files no checkpoint refers to go
            SharedStateRegistry(self.storage).remove_orphans()
        env = TaskEnvironment(
            jm_endpoint=self.endpoint,
            attempt=attempt,
            config=config,
            checkpoint_root=self.storage.root if self.storage else None,
            restore_root=restore.storage.root if restore else None,
            restore_metadata=restore.metadata if restore else None,
            run_id=self.run_id,
            faults=tuple(f for f in self.task_faults if f.attempt == attempt),
            channel_keys=self.keys,
        )
        run = Attempt(
            attempt,
            plan,
            config,
            self.storage,
            self.next_checkpoint_id,
            self.services,
            job_started=started,
            submit_wall=time.time(),
            restored_superstep=(restore.metadata.superstep or 0) if restore else 0,
            compensator=self._compensator(restore),
        )
        stage = launcher.start(plan, env, f"absflow-{self.run_id}-{attempt}")
        try:
            run.run(stage)
        finally:
            self.next_checkpoint_id = max(self.next_checkpoint_id, run.coordinator.next_id)
        return run

    def _compensator(self, restore: RestorePoint | None) -> Compensator | None:
        """The compensation of an attempt that restores a rescue snapshot."""
        settings = self.config.optimistic_recovery
        if restore is None or restore.metadata.rescue is None or settings is None:
            return None
        step = superstep_step(self.plan)
        if step is None:
            return None
        return Compensator(
            settings.compensation, bool(step.args["delta"]), f"iteration step '{step.name}'"
        )


def open_checkpoint_storage(
    root: str, storage_options: Mapping[str, Any] | None = None
) -> CheckpointStorage:
    """The checkpoint storage at ``root`` (a path or a URL; created if missing), proven
    writable by creating and removing a probe file in it. Raises CheckpointStorageError
    naming the path or URL, the error and the fix: a restart cannot fix storage the job
    cannot write. (This proves the driver can write it; each task's first state write
    proves it for its executor, see ``runtime.checkpointer``.)"""
    existed, storage = False, None
    try:
        storage = CheckpointStorage(root, storage_options=storage_options)
        existed = storage.exists()
        storage.probe()  # creates the root (and missing parents)
    except StorageAccessError as err:  # remote storage: the message names the URL
        raise CheckpointStorageError(
            f"checkpoint_dir {root!r} is not writable from the driver: {err}. Check the "
            "URL (the bucket must exist), and the endpoint and credentials in "
            "storage_options."
        ) from err
    except StateError as err:  # e.g. the package of the URL's scheme is missing
        raise CheckpointStorageError(f"checkpoint_dir {root!r}: {err}") from err
    except OSError as err:
        what = "is not writable" if existed else "cannot be created"
        raise CheckpointStorageError(
            f"checkpoint_dir {storage.root if storage else root!r} {what}: {_os_error(err)}. "
            f"{_storage_fix(err)}"
        ) from err
    return storage


def _os_error(err: OSError) -> str:
    return f"{type(err).__name__}: {err.strerror or err}"


def _storage_fix(err: OSError) -> str:
    if err.errno in (errno.ENOENT, errno.ENOTDIR):
        return (
            "Create its parent directory (on a cluster, a filesystem every executor mounts) "
            "or pass another checkpoint_dir."
        )
    return (
        "Make it writable for the user running the driver and the tasks (on a cluster, a "
        "filesystem every executor mounts), or pass another checkpoint_dir."
    )


__all__ = ["DriverKill", "JobManager", "TaskFault", "run_job"]
