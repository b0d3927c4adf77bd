"""The launcher's slot check and warm-up, with fake Spark contexts (no JVM), plus one
warm-up on the real session whose Python worker dies."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import pytest

from jobmanager import launcher
from runtime.errors import CheckpointStorageError, InsufficientSlotsError, WorkerStartError


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


def test_warm_up_tries_again_when_a_worker_is_lost() -> None:
    said: list[str] = []
    sc = FlakyContext(failures=2)
    launcher.warm_up(sc, 2, say=said.append)
    assert sc.calls == 3
    assert said == [
        f"starting Python workers failed (a task process died (killed or crashed)); "
        f"trying again ({n} of 3)"
        for n in (2, 3)
    ]


def test_warm_up_fails_with_a_clear_error_when_workers_keep_dying() -> None:
    with pytest.raises(
        WorkerStartError, match="failed 3 times; the last time: a task process died"
    ):
        launcher.warm_up(FlakyContext(failures=5), 2, say=lambda _t: None)


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
    launcher.warm_up(spark.sparkContext, 2, say=said.append, load=_die_once(str(marker)))
    assert not marker.exists() and len(said) == 1 and "trying again (2 of 3)" in said[0]


@pytest.mark.parametrize("master", ["spark://10.0.0.1:7077", "yarn", "k8s://https://h:443"])
def test_a_cluster_needs_a_checkpoint_dir_every_executor_reaches(master: str) -> None:
    with pytest.raises(CheckpointStorageError, match="checkpoint_dir that every executor"):
        launcher.check_checkpoint_dir(master, None, checkpointing=True)
    launcher.check_checkpoint_dir(master, "/shared/chk", checkpointing=True)
    launcher.check_checkpoint_dir(master, None, checkpointing=False)


@pytest.mark.parametrize("master", ["local[4]", "local", "local-cluster[2,1,1024]"])
def test_one_host_can_use_the_default_checkpoint_dir(master: str) -> None:
    launcher.check_checkpoint_dir(master, None, checkpointing=True)
