"""The test harness (``runtime.api.testing``): real pipelines as local task processes,
without Spark: testing sources and sinks, faults, restarts, refusals, and nothing left
behind (the ``harness`` fixture checks processes, ports and temp dirs after each test)."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from channels.zmq_io import local_namespace
from jobmanager.failures import FailureCause
from jobmanager.faults import Kill, RaiseAt
from jobmanager.liveness import pid_alive
from jobmanager.result import JobResult
from runtime import Dataflow, GraphError, TaskFailedError
from runtime.api.testing import ListSink, TestingSource, run_local
from runtime.errors import AbsflowError
from runtime.sources import GeneratorSource, Source, SourceReader
from statebackend import CheckpointStorage
from tests.conftest import child_processes, session_socket_inodes

pytestmark = [pytest.mark.harness]  # the harness fixture: see tests/conftest.py


def keyed_sums(n: int, rate: float | None = None, **config: Any) -> Dataflow:
    flow = Dataflow("sums", parallelism=2, **config)
    (
        flow.source(GeneratorSource(lambda i: i % 50, n, rate=rate), name="numbers")
        .key_by(lambda x: x)
        .reduce(lambda a, b: a + b, name="sum")
        .collect("sums")
    )
    return flow


def test_a_user_function_raising_names_its_step() -> None:
    flow = Dataflow("raise", parallelism=2)
    flow.source(GeneratorSource(lambda i: i, 1000), name="numbers").map(
        lambda x: 1 // (x - 500), name="divide"
    ).collect("o")
    with pytest.raises(TaskFailedError) as info:
        run_local(flow)
    assert info.value.operator == "divide" and "ZeroDivisionError" in str(info.value)


class _BrokenReader(SourceReader):
    def read_batch(self, max_records: int) -> list[Any] | None:
        raise OSError("the disk is gone")

    def snapshot(self) -> Any:
        return 0

    def restore(self, state: Any) -> None:
        pass


class BrokenSource(Source):
    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return _BrokenReader()


def test_a_task_error_outside_user_functions_fails_the_job_naming_the_task() -> None:
    """The task reports the error, then its process exits with an error code."""
    flow = Dataflow("broken", parallelism=1)
    flow.source(BrokenSource(), name="disk").collect("o")
    with pytest.raises(TaskFailedError) as info:
        run_local(flow)
    assert "a task failed in operator 'disk[0]'" in str(info.value)
    assert "OSError: the disk is gone" in str(info.value)


def test_injected_raise_at_record_names_the_step() -> None:
    with pytest.raises(TaskFailedError) as info:
        run_local(keyed_sums(2000), faults=[RaiseAt("sum", record=100)])
    assert info.value.operator == "sum" and "injected failure at record 100" in str(info.value)


@pytest.mark.parametrize(
    ("inline_threshold", "compression"),
    [(20 * 1024, False), (0, False), (0, True)],
    ids=["inline", "files", "lz4-files"],
)
def test_sigkill_after_checkpoint_k_gives_the_failure_free_output(
    tmp_path: Any, inline_threshold: int, compression: bool
) -> None:
    # rate-limited: the job outlives checkpoint 2 even on a fast machine
    root = tmp_path / "chk"
    config = {
        "checkpoint_dir": str(root),
        "state_inline_threshold": inline_threshold,
        "snapshot_compression": compression,
    }
    killed = run_local(
        keyed_sums(60_000, rate=60_000, checkpoint_interval=0.05, **config),
        faults=[Kill("sum[1]", after_checkpoint=2)],
    )
    clean = run_local(keyed_sums(60_000))
    assert killed.unfired_faults == []
    [restart] = killed.restarts
    assert restart.cause is FailureCause.TASK_DIED and restart.restored_checkpoint is not None
    assert restart.restored_checkpoint >= 2
    assert collections.Counter(killed.output("sums")) == collections.Counter(clean.output("sums"))
    # Where the restored and retained checkpoints kept each task's state.
    storage = CheckpointStorage(str(root))
    retained = storage.completed_checkpoints()
    assert retained
    for n in retained:
        handles = storage.check(n).tasks
        state_files = {p.name for p in (root / f"chk-{n}").glob("*.state")}
        assert state_files == {h.file for h in handles.values() if h.inline is None}
        for path in (root / f"chk-{n}").glob("*.state"):  # flags: lz4 blocks (0) or raw
            assert path.read_bytes()[10:12] == (b"\0\0" if compression else b"\0\1")
        small = {task for task, h in handles.items() if h.size <= inline_threshold}
        assert {task for task, h in handles.items() if h.inline is not None} == small
        if inline_threshold:
            assert {"numbers[0]", "numbers[1]", "sum[0]", "sum[1]"} <= small


def test_without_checkpoints_a_kill_is_not_survived() -> None:
    """Companion of the kill test: the same kill without checkpoints (no restarts) fails."""
    with pytest.raises(TaskFailedError) as info:
        run_local(keyed_sums(60_000, rate=60_000), faults=[Kill("sum[1]", after_seconds=0.2)])
    assert "a task process died" in str(info.value)


def _abstract_sockets() -> collections.Counter[str]:
    """The abstract Unix sockets of absflow gates that this test session's processes hold,
    by name: the listening one and one per accepted connection (the path is
    /proc/net/unix's last column, the inode its seventh). Another xdist worker's or test
    session's gates on the same host are not counted."""
    ours = session_socket_inodes()
    with open("/proc/net/unix") as f:
        rows = (line.split() for line in f)
        return collections.Counter(
            r[-1] for r in rows if len(r) >= 8 and r[-1].startswith("@absflow-") and r[6] in ours
        )


def _run_watching_sockets(flow: Dataflow) -> tuple[JobResult, collections.Counter[str]]:
    """Run ``flow``; the most sockets each gate name had at once while it ran."""
    peak: collections.Counter[str] = collections.Counter()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for name, count in _abstract_sockets().items():
                peak[name] = max(peak[name], count)
            done.wait(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        return run_local(flow), peak
    finally:
        done.set()
        watcher.join()


@pytest.mark.skipif(local_namespace() is None, reason="abstract Unix sockets exist on Linux only")
def test_tasks_on_one_host_exchange_records_over_unix_sockets_and_leave_none_behind() -> None:
    before = set(_abstract_sockets())
    outputs = {}
    for local in (True, False):
        result, peak = _run_watching_sockets(keyed_sums(200_000, local_channels=local))
        outputs[local] = sorted(result.output("sums"))
        new = {name: count for name, count in peak.items() if name not in before}
        if local:  # the two sum tasks' gates, each with both sources connected
            assert len(new) == 2 and all(count >= 3 for count in new.values()), new
        else:  # the switch: TCP only
            assert new == {}, new
    assert outputs[True] == outputs[False] and len(outputs[True]) == 200_000
    assert set(_abstract_sockets()) <= before  # closed with their tasks


def test_spark_only_settings_are_refused() -> None:
    with pytest.raises(GraphError) as info:
        run_local(keyed_sums(10), local_master="local[4]")
    assert "local_master" in str(info.value) and "launcher='spark'" in str(info.value)
    with pytest.raises(GraphError) as info:
        run_local(keyed_sums(10), executor_wait=5.0)
    assert "executor_wait" in str(info.value)


def test_unknown_launchers_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(GraphError) as info:
        keyed_sums(10, launcher="threads")
    assert "'threads' is unknown" in str(info.value) and "spark, local" in str(info.value)
    with pytest.raises(AbsflowError) as err:
        run_local(keyed_sums(10), launcher="spark")
    assert "flow.run(" in str(err.value)
    monkeypatch.setenv("ABSFLOW_LAUNCHER", "yarn")
    with pytest.raises(GraphError) as info:
        keyed_sums(10).run()
    assert "ABSFLOW_LAUNCHER='yarn'" in str(info.value)


DRIVER = """
import sys, time
from runtime import Dataflow
from runtime.sources import GeneratorSource, Source, SourceReader
from runtime.api.testing import run_local
flow = Dataflow("forever", parallelism=2)
flow.source(GeneratorSource(lambda i: i, None, rate=1000), name="n").collect("o")
run_local(flow)
"""


def test_task_processes_end_when_the_driver_is_killed(tmp_path: Any) -> None:
    # A SIGKILLed driver leaves its files (its running-job entry): in its own TMPDIR.
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER],
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), TMPDIR=str(tmp_path)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        tasks: set[int] = set()
        servers: set[int] = set()
        while len(tasks) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
            servers = child_processes(driver.pid)  # the fork server (tasks are its children)
            tasks = {task for server in servers for task in child_processes(server)}
        assert len(tasks) == 2, "the driver did not start its two task processes"
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in tasks | servers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(p) for p in tasks), "task processes outlived their driver"
    assert not any(pid_alive(p) for p in servers), "the fork server outlived its driver"


def test_the_leak_check_sees_a_child_process_left_running() -> None:
    """Companion of the ``harness`` fixture's check: a child still running is seen, one
    reaped is not."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert child.pid in child_processes()
    finally:
        child.kill()
        child.wait()
    assert child.pid not in child_processes()


def test_profile_dir_gets_a_cpu_profile_of_every_task(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ABSFLOW_PROFILE_DIR: each local task process writes a readable cProfile of itself,
    also the tasks the job manager releases before their run returned; without the
    variable nothing is written."""
    import pstats

    def job(out: list[Any]) -> Dataflow:
        flow = Dataflow("profiled", parallelism=2)
        (
            flow.source(TestingSource(list(range(200))), name="numbers")
            .key_by(lambda x: x % 3)
            .aggregate(0, lambda c, _x: c + 1, name="count")
            .sink(ListSink(out), name="counts")
        )
        return flow

    out: list[Any] = []
    run_local(job(out))
    assert len(out) == 200 and not list(tmp_path.iterdir())  # off: no profile anywhere
    monkeypatch.setenv("ABSFLOW_PROFILE_DIR", str(tmp_path))
    out = []
    run_local(job(out))
    assert len(out) == 200
    profiles = sorted(tmp_path.glob("task-*.prof"))
    assert sorted(p.name.split("-")[1] for p in profiles) == ["0", "1", "2", "3"]
    for path in profiles:
        functions = {fn for _file, _line, fn in pstats.Stats(str(path)).stats}  # type: ignore[attr-defined]
        assert "run_task" in functions
