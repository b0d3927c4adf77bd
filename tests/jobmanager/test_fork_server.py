"""The local launcher's fork server (``jobmanager.fork_server``, ``runtime.fork_entry``):
task processes forked from a process that imported the task side once behave as
processes started afresh: the same output, the same exits and signals, the same
environment, and nothing outlives the server or the job."""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

import jobmanager.fork_server as fork_server_module
from jobmanager.faults import Kill
from jobmanager.fork_server import ForkServer, dumps_naming_modules, fork_server, fork_server_pids
from jobmanager.liveness import pid_alive
from runtime import Dataflow
from runtime.api.testing import run_local
from runtime.sources import CollectionSource
from tests.conftest import child_processes
from tests.integration.topologies import HeldGenerator

pytestmark = pytest.mark.usefixtures("harness")


def wait_for(condition: Any, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def server() -> Iterator[ForkServer]:
    """A fork server of this test's own (not the session's)."""
    own = ForkServer(os.pathsep.join(p for p in sys.path if p))
    try:
        yield own
    finally:
        own.close()


def spawn_sleeper(server: ForkServer, env: dict[str, str] | None = None) -> Any:
    """A forked task process that waits for its attempt on stdin (never sent)."""
    r, w = os.pipe()
    try:
        task = server.spawn(0, w, dict(os.environ, **(env or {})))
    finally:
        os.close(w)
    os.close(r)
    return task


def test_a_forked_task_is_the_servers_child_and_reports_how_it_ended(
    server: ForkServer,
) -> None:
    task = spawn_sleeper(server)
    assert task.pid in child_processes(server.proc.pid)
    assert task.poll() is None
    task.kill()
    assert wait_for(lambda: task.poll() is not None)
    assert task.returncode == -signal.SIGKILL


def test_a_forked_task_without_its_attempt_exits_with_an_error(server: ForkServer) -> None:
    # The attempt never comes: stdin closes, as when the job manager is gone.
    task = spawn_sleeper(server)
    assert task.stdin is not None
    task.stdin.close()
    assert wait_for(lambda: task.poll() is not None)
    assert task.returncode == 1


def test_the_server_ends_when_its_launcher_closes_it(server: ForkServer) -> None:
    task = spawn_sleeper(server)
    pid = server.proc.pid
    server.close()
    assert not pid_alive(pid)
    assert task.stdin is not None
    task.stdin.close()  # the task ends itself once its stdin closes
    assert wait_for(lambda: not pid_alive(task.pid))
    assert task.poll() == -signal.SIGKILL  # the server is gone: counted as killed


def flow(checkpoints: str) -> Dataflow:
    f = Dataflow("forked", parallelism=2, checkpoint_interval=0.2)
    source = HeldGenerator(lambda i: i % 97, 20_000, checkpoints, held_until=2, rate=20_000)
    (
        f.source(source, name="n")
        .key_by(lambda x: x)
        .reduce(lambda a, b: a + b, name="sum")
        .collect("out")
    )
    return f


def test_a_job_forked_and_one_started_afresh_give_the_same_output_also_under_a_kill(
    tmp_path: Path,
) -> None:
    fresh_dir, forked_dir = str(tmp_path / "fresh"), str(tmp_path / "forked")
    fresh = run_local(flow(fresh_dir), checkpoint_dir=fresh_dir, fork_server=False)
    assert fresh.restarts == []
    kill = Kill("sum[1]", after_checkpoint=2)
    forked = run_local(flow(forked_dir), checkpoint_dir=forked_dir, faults=[kill])
    assert fork_server_pids(), "the job did not use the fork server"
    assert len(forked.restarts) == 1 and forked.unfired_faults == []
    assert sorted(forked.output("out")) == sorted(fresh.output("out"))


def test_the_session_fork_server_is_reused_and_replaced_when_the_path_changes() -> None:
    path = os.pathsep.join(p for p in sys.path if p)
    first = fork_server(path)
    assert first is not None and fork_server(path) is first
    other = fork_server(path + os.pathsep + os.getcwd() + "/nowhere")
    assert other is not None and other is not first
    assert not first.alive
    assert fork_server_pids() == {other.proc.pid}


def test_a_server_whose_tasks_still_run_is_kept_until_they_ended() -> None:
    path = os.pathsep.join(p for p in sys.path if p)
    first = fork_server(path)
    assert first is not None
    task = spawn_sleeper(first)
    second = fork_server(path + os.pathsep + os.getcwd() + "/elsewhere")
    assert second is not None and first.alive  # its task runs: closing it would orphan it
    task.kill()
    assert wait_for(lambda: task.poll() is not None)
    assert task.returncode == -signal.SIGKILL  # reported by the server that forked it
    assert fork_server(path) is first  # still its path's server
    third = fork_server(path + os.pathsep + os.getcwd() + "/third")
    assert third is not None and not first.alive and not second.alive  # idle: ended


def probe_module(root: Path, name: str, body: str = "def apply(x):\n    return 2 * x\n") -> Any:
    """A module ``name`` in ``root`` (on sys.path) that notes the pid of every process
    importing it in ``<name>.imports``; imported here, as a driver has its modules."""
    path = root / f"{name}.py"
    path.write_text(
        "import os\n"
        f"with open({str(root / (name + '.imports'))!r}, 'a') as fh:\n"
        "    fh.write(f'{os.getpid()}\\n')\n" + body
    )
    sys.modules.pop(name, None)
    return importlib.import_module(name)


def importers(root: Path, name: str) -> list[int]:
    return [int(line) for line in (root / f"{name}.imports").read_text().split()]


def probe_flow(module: Any) -> Dataflow:
    f = Dataflow("preload", parallelism=2)
    f.source(CollectionSource(list(range(20))), name="numbers").map(module.apply).collect("out")
    return f


@pytest.fixture
def probe_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on sys.path (the tasks' path: a fork server of the test's own)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [
        n for n, m in sys.modules.items() if str(tmp_path) in str(getattr(m, "__file__", ""))
    ]:
        del sys.modules[name]


def test_a_job_pickled_names_the_modules_its_tasks_import() -> None:
    job = (Kill("x", after_checkpoint=1), HeldGenerator, os.getpid)
    payload, modules = dumps_naming_modules(job)
    assert payload == cloudpickle.dumps(job)
    assert {"jobmanager.faults", "tests.integration.topologies"} <= modules
    assert "__main__" not in modules and "posix" not in modules  # no file to import


def test_a_preloaded_module_is_imported_once_by_the_server_not_by_each_task(
    probe_root: Path,
) -> None:
    module = probe_module(probe_root, "probe_once")
    me = importers(probe_root, "probe_once")
    result = run_local(probe_flow(module), fork_preload=True)
    assert sorted(result.output("out")) == [2 * x for x in range(20)]
    (server,) = importers(probe_root, "probe_once")[len(me) :]  # the server only
    assert server in fork_server_pids()
    # Companion: without preloading, every task process that unpickles the job imports it.
    other = probe_module(probe_root, "probe_each")
    run_local(probe_flow(other), fork_preload=False)
    assert len(importers(probe_root, "probe_each")[len(me) :]) >= 2


def test_a_module_changed_on_disk_gets_a_new_server_and_the_new_code(probe_root: Path) -> None:
    module = probe_module(probe_root, "probe_changed")
    assert sorted(run_local(probe_flow(module), fork_preload=True).output("out"))[-1] == 38
    first = fork_server_pids()
    module = probe_module(probe_root, "probe_changed", "def apply(x):\n    return 3 * x\n")
    path = probe_root / "probe_changed.py"
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 1_000_000_000))  # surely newer
    assert sorted(run_local(probe_flow(module), fork_preload=True).output("out"))[-1] == 57
    servers = importers(probe_root, "probe_changed")
    assert len(set(servers) - {os.getpid()}) == 2  # one server each, the first retired
    assert fork_server_pids() - first


def test_a_module_that_starts_a_thread_is_not_preloaded_and_the_job_still_runs(
    probe_root: Path,
) -> None:
    body = (
        "import threading\n"
        "threading.Thread(target=threading.Event().wait, daemon=True).start()\n"
        "def apply(x):\n    return 2 * x\n"
    )
    module = probe_module(probe_root, "probe_thread", body)
    result = run_local(probe_flow(module), fork_preload=True)
    assert sorted(result.output("out")) == [2 * x for x in range(20)]
    assert "probe_thread" in fork_server_module._unsafe
    # The server that imported it forks no more; the tasks came from another, and each
    # imported the module itself.
    assert len(importers(probe_root, "probe_thread")) >= 1 + 1 + 2
