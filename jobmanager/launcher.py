"""Spark side of the driver: the session, the slot check, and one barrier stage per attempt
(`SparkBarrierLauncher`, the job manager's default launcher; see ``jobmanager.launchers``).

Every attempt of a job is one barrier-mode result stage of N tasks (one per
physical task) run from a background thread of the driver. Spark never retries a
failed barrier result stage; the job manager resubmits it itself.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from channels.rendezvous import Rendezvous
from runtime.config import JobConfig
from runtime.errors import (
    CheckpointStorageError,
    InsufficientSlotsError,
    UnsupportedSessionError,
    WorkerStartError,
)
from runtime.plan import JobPlan
from runtime.task_environment import TaskEnvironment

log = logging.getLogger("absflow.launcher")

_owned_session: Any = None
SPARE_SLOTS = 2


def _stop_owned() -> None:
    global _owned_session
    if _owned_session is not None:
        try:
            _owned_session.stop()
        finally:
            _owned_session = None


def submitted() -> bool:
    """True when this driver was started by spark-submit (or another Spark launcher that
    hands pyspark a running JVM gateway): the submitted configuration, ``--master``
    included, is then the one to use."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def ensure_session(
    tasks_needed: int, config: JobConfig, say: Callable[[str], None] = log.info
) -> Any:
    """The SparkSession to run on.

    * an active session (the user's, or the one spark-submit configured): used as is;
    * under spark-submit with no session yet: one built from the submitted
      configuration (``--master``, ``--conf``), never overridden;
    * a plain ``python script.py``: an embedded ``local[tasks + 2]`` session, created once
      per driver process (stopped at exit) and recreated bigger if a later job needs
      more slots than it has.
    """
    global _owned_session
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is None and SparkContext._active_spark_context is not None:
        active = SparkSession.builder.getOrCreate()
    if active is not None and active is not _owned_session:
        return active
    if active is None and submitted() and config.local_master is None:
        say("using the SparkSession configured by spark-submit")
        return SparkSession.builder.appName("absflow").getOrCreate()
    if active is not None and available_slots(active.sparkContext) >= tasks_needed:
        return active
    if active is not None:
        _stop_owned()
    # Workers must run this interpreter and import what the driver imports.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = task_pythonpath()
    # Two spare slots: a restarted attempt finds idle, warm Python workers.
    master = config.local_master or f"local[{tasks_needed + SPARE_SLOTS}]"
    spark = (
        SparkSession.builder.master(master)
        .appName("absflow")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # Reused Python workers start a barrier stage in ~0.1 s instead of ~1.2 s.
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.extraJavaOptions", "-Dlog4j2.level=ERROR")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("FATAL")
    if _owned_session is None:
        atexit.register(_stop_owned)
    _owned_session = spark
    warm_up(spark.sparkContext, available_slots(spark.sparkContext), say=say)
    return spark


def task_pythonpath() -> str:
    """The driver's ``sys.path`` (and working directory) as a PYTHONPATH, so that task
    processes import what the driver imports (user functions pickled by reference)."""
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    if os.getcwd() not in paths:
        paths.insert(0, os.getcwd())
    return os.pathsep.join(dict.fromkeys(paths))


def _load_task_code(_: Any) -> list[int]:
    import runtime.task  # noqa: F401

    return [os.getpid()]


def warm_up(
    sc: Any,
    n: int,
    say: Callable[[str], None] = log.info,
    load: Callable[[Any], list[int]] = _load_task_code,
) -> bool:
    """Start ``n`` Python workers at once and import the task code in them, so the
    first barrier stage (and a restart) takes pooled workers instead of forking.
    Returns whether it did.

    It is only a head start: a worker lost meanwhile (killed, crashed, out of memory)
    is no reason to fail the job, nor to retry here: the job's attempts start their own
    workers, and a failure there goes through the job's restart strategy like any other.
    Only an error no restart can fix (the workers cannot import the task code) fails,
    as a WorkerStartError that quotes it.
    """
    try:
        sc.parallelize(range(n), n).barrier().mapPartitions(load).collect()
        return True
    except Exception as err:  # Py4JJavaError: "Could not recover from a failed barrier ..."
        text = str(err)
        if "ModuleNotFoundError" in text or "ImportError" in text:
            raise WorkerStartError(
                f"the Spark Python workers cannot import absflow's task code "
                f"({_import_error(text)}). Check that the executors run {sys.executable} (or "
                "an interpreter with absflow and its dependencies installed) and that "
                "PYTHONPATH or --py-files ship the job's modules."
            ) from err
        say(
            f"warming up Python workers failed ({describe_stage_error(err)}); "
            "the job starts its own"
        )
        return False


def _import_error(text: str) -> str:
    lines = [
        x.strip() for x in text.splitlines() if "ModuleNotFoundError" in x or "ImportError" in x
    ]
    return lines[-1][:300] if lines else "ImportError"


def available_slots(sc: Any) -> int:
    """Task slots of the cluster right now (what a barrier stage can occupy at once)."""
    jsc = sc._jsc.sc()
    try:
        return int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
    except Exception:  # older/other Spark versions
        return int(sc.defaultParallelism)


def _fixed_local(master: str) -> bool:
    """``local``/``local[n]``/``local[*]``: every slot exists as soon as the context does."""
    return master == "local" or (
        master.startswith("local[") and not master.startswith("local-cluster")
    )


def single_host(master: str) -> bool:
    """``local[...]`` and ``local-cluster[...]``: every executor runs on the driver's host."""
    return master.startswith("local")


def check_checkpoint_dir(master: str, checkpoint_dir: str | None, checkpointing: bool) -> None:
    """On a cluster the default checkpoint dir (a temp dir on the driver) is out of the
    executors' reach: ask for storage every executor can write to."""
    if checkpointing and checkpoint_dir is None and not single_host(master):
        raise CheckpointStorageError(
            f"checkpointing on master {master!r} needs a checkpoint_dir that every executor "
            "can write to (a shared filesystem, HDFS or S3): "
            "Dataflow(..., checkpoint_dir='/shared/path') or --checkpoint-dir; the default, "
            "a temp dir on the driver, exists only on the driver's host"
        )


def classic_context(spark: Any) -> Any:
    """The SparkContext of ``spark``. Barrier stages are an RDD API: a Spark Connect
    session (``.remote(...)``, ``SPARK_REMOTE``, ``spark-submit --remote``) has no
    SparkContext, and is refused here, naming the way to a classic session."""
    connect = type(spark).__module__.startswith("pyspark.sql.connect")
    try:
        sc = None if connect else spark.sparkContext
    except Exception:  # PySparkNotImplementedError on a Connect session
        sc = None
    if sc is None or not hasattr(sc, "_jsc"):
        raise UnsupportedSessionError(
            f"absflow runs each attempt as a Spark barrier stage, an RDD API that a Spark "
            f"Connect session ({type(spark).__module__}.{type(spark).__name__}) does not "
            "have. Use a classic session: submit the script with spark-submit --master URL "
            "(python -m jobmanager submit), or build SparkSession.builder.master(URL) "
            "without .remote() and with SPARK_REMOTE and SPARK_CONNECT_MODE_ENABLED unset."
        )
    return sc


def check_dynamic_allocation(sc: Any) -> None:
    """Barrier stages need a fixed set of executors: Spark refuses them under dynamic
    allocation (which Spark ignores on ``local[n]``), and an executor it removed for
    being idle would end the job's task slots."""
    enabled = str(sc.getConf().get("spark.dynamicAllocation.enabled", "false")).lower()
    if enabled == "true" and not _fixed_local(sc.master):
        raise UnsupportedSessionError(
            f"spark.dynamicAllocation.enabled is true on master {sc.master}: barrier stages "
            "(every absflow attempt) need a fixed set of executors and Spark refuses them "
            "with dynamic allocation. Set --conf spark.dynamicAllocation.enabled=false "
            "(python -m jobmanager submit sets it) and size the executors for the job's tasks "
            "(spark.executor.instances, spark.executor.cores)."
        )


def check_slots(
    sc: Any,
    needed: int,
    wait: float = 60.0,
    say: Callable[[str], None] = log.info,
    clock: Callable[[], float] = time.monotonic,
    poll: float = 0.2,
) -> int:
    """Fail fast where Spark would wait silently for slots a barrier stage cannot get.

    On a cluster (``local-cluster``, standalone, YARN) executors register after the
    context starts, and replace lost ones after a while: wait up to ``wait`` seconds for
    enough slots, saying so, then fail naming the slots needed and available. Returns
    the slots available.
    """
    slots = available_slots(sc)
    if slots < needed and not _fixed_local(sc.master):
        say(
            f"waiting up to {wait:.0f} s for executors: {slots} of {needed} task slots registered "
            f"(master {sc.master})"
        )
        deadline = clock() + wait
        while slots < needed and clock() < deadline:
            time.sleep(poll)
            slots = available_slots(sc)
        if slots >= needed:
            say(f"executors ready: {slots} task slots")
    if slots < needed:
        if _fixed_local(sc.master):
            waited, fix = "", f"Use local[{needed}]"
        else:
            waited = f" after waiting {wait:.0f} s for executors"
            fix = (
                "Add executors or cores (spark.executor.instances, spark.executor.cores, "
                "spark.cores.max; on standalone, workers with more --cores), wait longer "
                "(executor_wait)"
            )
        raise InsufficientSlotsError(
            f"the job has {needed} tasks but the SparkSession has only {slots} task slots{waited} "
            f"(master {sc.master}); a barrier stage needs one slot per task. {fix}, or lower "
            f"the parallelism or chain more steps."
        )
    return slots


def driver_host(sc: Any) -> str:
    """The address the job manager binds on (the driver's host, as Spark sees it)."""
    host = sc.getConf().get("spark.driver.host", None) or socket.gethostname()
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


class StageRunner:
    """Runs one attempt's barrier stage in a background thread; ``outcome`` gets the
    stage's end: None for success or the exception Spark raised."""

    def __init__(
        self,
        spark: Any,
        plan: JobPlan,
        env: TaskEnvironment,
        group: str,
        host: str,
        on_refused: Callable[[int], None] = lambda n: None,
    ) -> None:
        """``on_refused``: told, when the stage ends, how many connections its rendezvous
        refused for want of the job's keys."""
        self.sc = spark.sparkContext
        self.plan, self.env, self.group, self.host = plan, env, group, host
        self.on_refused = on_refused
        self.outcome: queue.Queue[BaseException | None] = queue.Queue()
        self.thread = threading.Thread(
            target=self._run, name=f"absflow-stage-{env.attempt}", daemon=True
        )

    def start(self) -> StageRunner:
        self.thread.start()
        return self

    def _run(self) -> None:
        plan, env, n = self.plan, self.env, len(self.plan.tasks)
        try:
            with Rendezvous(self.host, n, env.channel_keys) as rendezvous:
                endpoint = rendezvous.endpoint

                # The closure carries env and with it the run's CURVE keys (if any):
                # cloudpickled with the task function, the keys reach the executors only
                # inside the stage (never on a command line, in a file or a log).
                def entry(_: Any) -> Any:
                    from runtime.task_entry import run_barrier_task

                    return run_barrier_task(plan, env, endpoint)

                group = f"absflow '{plan.name}' attempt {env.attempt}"
                self.sc.setJobGroup(self.group, group, True)
                try:
                    self.sc.parallelize(range(n), n).barrier().mapPartitions(entry).collect()
                finally:
                    self.on_refused(rendezvous.refused)
            self.outcome.put(None)
        except BaseException as err:  # reported to the job manager thread
            self.outcome.put(err)

    def cancel(self) -> None:
        try:
            self.sc.cancelJobGroup(self.group)
        except Exception as err:  # the context may already be stopping
            log.debug("cancelJobGroup(%s) failed: %s", self.group, err)

    def join(self, timeout: float) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()


def describe_stage_error(err: BaseException) -> str:
    """A short, user-facing reason for a failed barrier stage."""
    text = str(err)
    if "exited unexpectedly" in text or "crashed" in text:
        return "a task process died (killed or crashed)"
    if "PythonException" in text:
        return "a task raised an exception"
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return first[:300]


class SparkBarrierLauncher:
    """Each attempt as one Spark barrier stage (the product's way to run a job)."""

    name = "spark"

    def __init__(self) -> None:
        self.spark: Any = None
        self.host = "127.0.0.1"
        self.local_hosts: set[str] = set()
        self.remote = False
        self._refused = 0

    @property
    def refused_connections(self) -> int:
        """Connections the ended stages' rendezvous refused."""
        return self._refused

    def _count_refused(self, n: int) -> None:  # from a stage's thread
        self._refused += n

    def prepare(self, tasks: int, config: JobConfig, say: Callable[[str], None]) -> None:
        """The session, then every check that can fail before an attempt is submitted."""
        self.spark = ensure_session(tasks, config, say=say)
        sc = classic_context(self.spark)
        check_dynamic_allocation(sc)
        check_checkpoint_dir(sc.master, config.checkpoint_dir, config.checkpointing)
        check_slots(sc, tasks, wait=config.executor_wait, say=say)
        self.host = driver_host(sc)
        self.remote = not single_host(sc.master)
        self.local_hosts = {self.host, "127.0.0.1", "localhost", socket.gethostname()}

    def before_restart(self, tasks: int, config: JobConfig, say: Callable[[str], None]) -> None:
        """A lost executor (a worker gone with its machine) takes its slots along: wait,
        bounded, for the cluster to replace them rather than submitting a barrier stage
        Spark would hold silently for minutes."""
        check_slots(self.spark.sparkContext, tasks, wait=config.executor_wait, say=say)

    def start(self, plan: JobPlan, env: TaskEnvironment, group: str) -> StageRunner:
        return StageRunner(self.spark, plan, env, group, self.host, self._count_refused).start()

    def close(self) -> None:
        """The session outlives the job (reused by the next one, stopped at exit)."""
