"""The local launcher's fork server (``jobmanager.fork_server``, ``runtime.fork_entry``):
task processes forked from a process that imported the task side once behave as
processes started afresh: the same output, the same exits and signals, the same
environment, and nothing outlives the server or the job."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobmanager.faults import Kill
from jobmanager.fork_server import ForkServer, fork_server, fork_server_pids
from jobmanager.liveness import pid_alive
from runtime import Dataflow
from runtime.api.testing import run_local
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
