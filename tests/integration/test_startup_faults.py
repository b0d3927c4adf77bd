"""Start-up is part of the fault domain: Spark Python workers SIGKILLed from outside from
the moment a driver starts (its warm-up, the first attempt's start) go through the job's
restart strategy: the job completes with exact output, or, with no restarts left, fails
naming what happened (a task process died while the tasks were starting)."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration import savepoint_job

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leaks")]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, command line) of every process we can read."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        found[int(name)] = (ppid, cmd)
    return found


def python_workers(driver: int) -> list[int]:
    """Spark's Python workers of ``driver``: the children of its pyspark daemon."""
    procs = _processes()

    def descends(pid: int) -> bool:
        for _ in range(20):
            if pid == driver:
                return True
            if pid not in procs:
                return False
            pid = procs[pid][0]
        return False

    daemons = {p for p, (_pp, cmd) in procs.items() if "pyspark.daemon" in cmd and descends(p)}
    return [p for p, (ppid, _cmd) in procs.items() if ppid in daemons]


class Killer(threading.Thread):
    """SIGKILLs every Python worker of ``driver`` as soon as it appears, ``limit`` in all
    (None: until the driver ends)."""

    def __init__(self, driver: subprocess.Popen[str], limit: int | None) -> None:
        super().__init__(daemon=True)
        self.driver, self.limit = driver, limit
        self.killed: list[int] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set() and self.driver.poll() is None:
            for pid in python_workers(self.driver.pid):
                if self.limit is not None and len(self.killed) >= self.limit:
                    return
                if pid not in self.killed:
                    os.kill(pid, signal.SIGKILL)
                    self.killed.append(pid)
            time.sleep(0.01)


def run_driver(
    tmp_path: Path, n: int, restarts: int, kills: int | None
) -> tuple[int, dict[str, Any], list[int]]:
    out = tmp_path / "out.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            os.path.join(ROOT, "tests", "integration", "savepoint_job.py"),
            "--bounded",
            str(n),
            str(restarts),
            str(out),
        ],
        env={**os.environ, "PYTHONPATH": ROOT},
        cwd=str(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    killer = Killer(proc, kills)
    killer.start()
    try:
        stdout, stderr = proc.communicate(timeout=400)
    finally:
        killer.done.set()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        killer.join(5)
    assert out.exists(), stdout[-2000:] + stderr[-4000:]
    return proc.returncode, json.loads(out.read_text()), killer.killed


def test_workers_killed_from_submit_on_are_restarted_and_the_output_is_exact(
    tmp_path: Path,
) -> None:
    n = 20_000
    # The first kills hit the warm-up's workers, the next ones the first attempt's.
    code, result, killed = run_driver(tmp_path, n, restarts=8, kills=12)
    assert killed, "no Python worker was seen to kill"
    assert code == 0, result
    print(f"killed {len(killed)} workers; restarts: {result['restarts']}")
    expected = collections.Counter(
        (f"user{k}", c)
        for k in range(savepoint_job.KEYS)
        for c in range(1, len(range(k, n, savepoint_job.KEYS)) + 1)
    )
    assert collections.Counter(tuple(r) for r in result["output"]) == expected


def test_with_no_restart_left_the_error_names_the_lost_worker(tmp_path: Path) -> None:
    code, result, killed = run_driver(tmp_path, 20_000, restarts=0, kills=None)
    assert killed and code == 1, result
    error = result["error"]
    assert "a task process died" in error or "while the tasks were starting" in error, error
    assert "restart strategy gave up" in error and "out of memory" not in error, error
    assert "WorkerStartError" not in error, error
