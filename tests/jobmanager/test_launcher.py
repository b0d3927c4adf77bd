"""The launcher's slot check and warm-up, with fake Spark contexts (no JVM), plus one
warm-up on the real session whose Python worker dies."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import pytest

from jobmanager import launcher
from runtime.errors import (
    CheckpointStorageError,
    InsufficientSlotsError,
    UnsupportedSessionError,
    WorkerStartError,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class RegisteringCluster:
    """A context whose executors register over time: ``slots_at(t)`` slots at clock t."""

    def __init__(self, master: str, slots_at: Callable[[float], int], clock: FakeClock) -> None:
        self.master = master
        self.slots_at = slots_at
        self.clock = clock

    def slots(self) -> int:
        self.clock.now += 0.5  # every look at the cluster takes a while
        return self.slots_at(self.clock.now)


@pytest.fixture
def cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[[str, Callable[[float], int]], RegisteringCluster]:
    clock = FakeClock()

    def make(master: str, slots_at: Callable[[float], int]) -> RegisteringCluster:
        sc = RegisteringCluster(master, slots_at, clock)
        monkeypatch.setattr(launcher, "available_slots", lambda _sc: sc.slots())
        monkeypatch.setattr("jobmanager.launcher.time.sleep", lambda _s: None)
        return sc

    return make


def test_the_slot_check_waits_for_executors_that_register_late(cluster: Any) -> None:
    said: list[str] = []
    sc = cluster("local-cluster[2,2,1024]", lambda t: 0 if t < 3.0 else 4)
    slots = launcher.check_slots(sc, 4, wait=60.0, say=said.append, clock=sc.clock)
    assert slots == 4
    assert "waiting up to 60 s for executors: 0 of 4 task slots" in said[0]
    assert said[-1] == "executors ready: 4 task slots"


def test_the_slot_check_gives_up_after_the_wait_naming_needed_and_available(cluster: Any) -> None:
    sc = cluster("spark://127.0.0.1:7077", lambda t: 2)
    with pytest.raises(InsufficientSlotsError) as info:
        launcher.check_slots(sc, 4, wait=5.0, say=lambda _t: None, clock=sc.clock)
    message = str(info.value)
    assert "4 tasks" in message and "only 2 task slots after waiting 5 s" in message
    assert sc.clock.now >= 5.0


def test_local_masters_have_every_slot_at_once_and_fail_without_waiting(cluster: Any) -> None:
    said: list[str] = []
    sc = cluster("local[2]", lambda t: 2)
    with pytest.raises(InsufficientSlotsError, match="only 2 task slots \\(master local\\[2\\]\\)"):
        launcher.check_slots(sc, 4, wait=60.0, say=said.append, clock=sc.clock)
    assert said == [] and sc.clock.now <= 0.5


class FlakyContext:
    """``parallelize(...).barrier().mapPartitions(f).collect()`` fails ``failures`` times."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def parallelize(self, *_args: Any) -> FlakyContext:
        return self

    def barrier(self) -> FlakyContext:
        return self

    def mapPartitions(self, _f: Any) -> FlakyContext:
        return self

    def collect(self) -> list[int]:
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError(
                "Could not recover from a failed barrier ResultStage: "
                "Python worker exited unexpectedly (crashed)"
            )
        return [1]


def test_a_worker_lost_in_the_warm_up_is_left_to_the_jobs_restart_strategy() -> None:
    """No retry loop of its own, no WorkerStartError: the attempts start their workers."""
    said: list[str] = []
    sc = FlakyContext(failures=5)
    assert launcher.warm_up(sc, 2, say=said.append) is False
    assert sc.calls == 1
    assert said == [
        "warming up Python workers failed (a task process died (killed or crashed)); "
        "the job starts its own"
    ]
    assert launcher.warm_up(FlakyContext(failures=0), 2, say=said.append) is True


class UnimportableContext(FlakyContext):
    def collect(self) -> list[int]:
        raise RuntimeError(
            "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
            '  File "<string>", line 1\n'
            "ModuleNotFoundError: No module named 'runtime'\n"
        )


def test_workers_that_cannot_import_the_task_code_fail_naming_the_import() -> None:
    with pytest.raises(WorkerStartError) as info:
        launcher.warm_up(UnimportableContext(0), 2, say=lambda _t: None)
    message = str(info.value)
    assert "cannot import" in message and "No module named 'runtime'" in message
    assert "out of memory" not in message


def _die_once(marker: str) -> Callable[[Any], list[int]]:
    def load(_: Any) -> list[int]:
        try:
            os.unlink(marker)
        except FileNotFoundError:
            return [os.getpid()]
        os.kill(os.getpid(), signal.SIGKILL)  # a Spark Python worker lost mid warm-up
        return []

    return load


@pytest.mark.integration
def test_warm_up_survives_a_python_worker_killed_on_the_real_session(
    spark: Any, tmp_path: Any
) -> None:
    marker = tmp_path / "die-once"
    marker.write_text("")
    said: list[str] = []
    ok = launcher.warm_up(spark.sparkContext, 2, say=said.append, load=_die_once(str(marker)))
    assert not ok and not marker.exists() and len(said) == 1
    assert "the job starts its own" in said[0]
    assert launcher.warm_up(spark.sparkContext, 2, say=said.append)  # Spark is fine after it


@pytest.mark.parametrize("master", ["spark://10.0.0.1:7077", "yarn", "k8s://https://h:443"])
def test_a_cluster_needs_a_checkpoint_dir_every_executor_reaches(master: str) -> None:
    with pytest.raises(CheckpointStorageError, match="checkpoint_dir that every executor"):
        launcher.check_checkpoint_dir(master, None, checkpointing=True)
    launcher.check_checkpoint_dir(master, "/shared/chk", checkpointing=True)
    launcher.check_checkpoint_dir(master, None, checkpointing=False)


@pytest.mark.parametrize("master", ["local[4]", "local", "local-cluster[2,1,1024]"])
def test_one_host_can_use_the_default_checkpoint_dir(master: str) -> None:
    launcher.check_checkpoint_dir(master, None, checkpointing=True)


class FakeConf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)


class FakeContext:
    """A classic SparkContext as the session checks see it."""

    def __init__(self, master: str, conf: dict[str, str] | None = None) -> None:
        self.master = master
        self._jsc = object()
        self.conf = FakeConf(conf or {})

    def getConf(self) -> FakeConf:
        return self.conf


class ClassicSession:
    def __init__(self, sc: FakeContext) -> None:
        self.sparkContext = sc


class ConnectSession:
    """Like pyspark.sql.connect.session.SparkSession: no SparkContext behind it."""

    @property
    def sparkContext(self) -> Any:
        raise NotImplementedError("[NOT_IMPLEMENTED] sparkContext() is not implemented.")


ConnectSession.__module__ = "pyspark.sql.connect.session"


def test_a_classic_session_gives_its_context() -> None:
    sc = FakeContext("spark://h:7077")
    assert launcher.classic_context(ClassicSession(sc)) is sc


def test_a_spark_connect_session_is_refused_naming_the_classic_way() -> None:
    with pytest.raises(UnsupportedSessionError) as info:
        launcher.classic_context(ConnectSession())
    message = str(info.value)
    assert "Spark Connect session (pyspark.sql.connect.session.ConnectSession)" in message
    assert "barrier stage" in message and "classic session" in message
    assert "spark-submit --master URL" in message and "SPARK_REMOTE" in message


@pytest.mark.parametrize("master", ["spark://h:7077", "yarn", "local-cluster[2,2,1024]"])
def test_dynamic_allocation_on_a_cluster_is_refused_with_the_conf_to_set(master: str) -> None:
    sc = FakeContext(master, {"spark.dynamicAllocation.enabled": "true"})
    with pytest.raises(UnsupportedSessionError) as info:
        launcher.check_dynamic_allocation(sc)
    message = str(info.value)
    assert f"spark.dynamicAllocation.enabled is true on master {master}" in message
    assert "--conf spark.dynamicAllocation.enabled=false" in message


@pytest.mark.parametrize(
    ("master", "conf"),
    [
        ("spark://h:7077", {}),
        ("yarn", {"spark.dynamicAllocation.enabled": "false"}),
        ("local[4]", {"spark.dynamicAllocation.enabled": "true"}),  # Spark ignores it there
    ],
)
def test_fixed_executors_pass_the_dynamic_allocation_check(
    master: str, conf: dict[str, str]
) -> None:
    launcher.check_dynamic_allocation(FakeContext(master, conf))


def test_the_slot_error_on_a_cluster_names_the_cluster_fix(cluster: Any) -> None:
    sc = cluster("spark://127.0.0.1:7077", lambda t: 4)
    with pytest.raises(InsufficientSlotsError) as info:
        launcher.check_slots(sc, 6, wait=1.0, say=lambda _t: None, clock=sc.clock)
    message = str(info.value)
    assert "6 tasks but the SparkSession has only 4 task slots after waiting 1 s" in message
    assert "spark.executor.cores" in message and "local[6]" not in message
