"""The suite's own leak checks (``tests/conftest.py``): they see what this session
(or this xdist worker) leaves behind, and nothing of another one's."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile

from tests.conftest import SESSION_TMP, SESSION_TMP_VAR, WORKER, Footprint


def test_the_session_has_its_own_temp_dir_named_after_its_worker() -> None:
    assert tempfile.gettempdir() == SESSION_TMP and os.path.isdir(SESSION_TMP)
    assert os.path.basename(SESSION_TMP).startswith(f"abstest-{WORKER}-")
    # what a task process started by this session inherits: the same dir, this owner
    assert os.environ[SESSION_TMP_VAR] == f"{WORKER}={SESSION_TMP}"
    if os.environ.get("PYTEST_XDIST_WORKER"):
        assert WORKER.startswith("gw")


def test_a_task_process_keeps_the_session_dir_and_an_xdist_worker_gets_its_own() -> None:
    probe = "import tests.conftest as c; print(c.SESSION_TMP, c._OWN_TMP)"
    task = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert task == [SESSION_TMP, "False"]
    other = {**os.environ, "PYTEST_XDIST_WORKER": f"{WORKER}x"}  # another worker
    worker = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=other
    ).stdout.split()
    try:
        assert worker[1] == "True" and worker[0] != SESSION_TMP
        assert os.path.dirname(worker[0]) == os.path.dirname(SESSION_TMP)  # beside, not in
        assert os.path.basename(worker[0]).startswith(f"abstest-{WORKER}x-")
    finally:
        shutil.rmtree(worker[0], ignore_errors=True)  # its atexit removed it already


def test_a_temp_dir_left_behind_is_found_and_another_workers_is_not() -> None:
    before = Footprint.take(children=True)
    ours = tempfile.mkdtemp(prefix="absflow-")
    beside = tempfile.mkdtemp(prefix="absflow-", dir=os.path.dirname(SESSION_TMP))
    try:
        left = before.leftovers(timeout=0.1)
        assert left.dirs == [ours] and not left.ports and not left.children
        assert left.problems() == [f"temp dirs left behind: {[ours]}"]
    finally:
        os.rmdir(ours)
        os.rmdir(beside)
    assert before.leftovers(timeout=0.1).problems() == []


def test_a_listening_port_and_a_child_process_left_behind_are_found() -> None:
    before = Footprint.take(children=True)
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        try:
            left = before.leftovers(timeout=0.1)
            assert left.ports == [port] and left.children == [child.pid]
            assert len(left.problems()) == 2
        finally:
            assert child.stdin is not None
            child.stdin.close()
            child.wait()
    assert before.leftovers(timeout=0.1).problems() == []
