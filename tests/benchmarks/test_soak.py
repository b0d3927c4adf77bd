"""The soak's verdicts (benchmarks/soak.py) and the stall loop's process search
(benchmarks/stall_loop.py): pure parts, no job runs here."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

from soak import Series
from stall_loop import CHECKPOINTS, one_run, session_pythons


def series(values: list[float], every: float = 0.5, allowance: float = 0.0) -> Series:
    s = Series("x", "MiB", allowance=allowance)
    for i, v in enumerate(values):
        s.add(i * every, v)
    return s


def test_a_steady_series_is_flat_after_its_warm_up() -> None:
    s = series([0, 10, 100, 101, 99, 100, 102, 100, 101, 100])  # start-up in the first minute
    assert s.flat(0.2, warmup=1.0)
    assert not s.flat(0.2, warmup=0.0)  # the start-up alone would look like growth
    assert abs(s.slope_per_10min(1.0)) < 20


def test_a_leak_grows() -> None:
    s = series([100 + 5 * i for i in range(30)])  # +5 MiB per half minute
    assert not s.flat(0.2, warmup=1.0)
    assert s.slope_per_10min(1.0) == 100.0
    first, last = s.thirds(1.0)
    assert last > first * 1.2


def test_the_allowance_absorbs_small_absolute_noise() -> None:
    assert not series([1, 1, 1, 3, 3, 3]).flat(0.2, warmup=0.0)
    assert series([1, 1, 1, 3, 3, 3], allowance=5).flat(0.2, warmup=0.0)


def test_session_pythons_finds_a_runs_children_and_nothing_else() -> None:
    code = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import time; time.sleep(30)'])"
    run = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(found := session_pythons(run.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert run.pid in found and len(found) == 2
        assert os.getpid() not in found
    finally:
        os.killpg(run.pid, 9)
        run.wait()
    assert session_pythons(run.pid) == []


# A stand-in for the main example: submits ("dashboard at" on stderr), holds until the
# loop has dumped its stacks (or at once when not asked to), then prints its summary.
FAKE_JOB = """
import os, sys, time
print("job 'fake': dashboard at http://127.0.0.1:1/", file=sys.stderr, flush=True)
dump, deadline = sys.argv[1], time.monotonic() + 60  # no dump: the test fails, not hangs
while dump and not os.path.exists(dump) and time.monotonic() < deadline:
    time.sleep(0.05)
print("  checkpoints: 4 completed + final, 0 failed, median duration 2270.5 ms")
"""


def test_a_run_past_the_median_job_time_is_dumped_while_it_stalls(tmp_path: Path) -> None:
    args = argparse.Namespace(factor=3.0, give_up=1000.0, py_spy=shutil.which("py-spy"))
    if args.py_spy is None or os.geteuid() != 0:
        pytest.skip("py-spy dumps need py-spy and the right to ptrace (root)")
    dump = tmp_path / "run-0007.txt"
    fake = [sys.executable, "-c", FAKE_JOB]
    stalled = one_run([*fake, str(dump)], 0.01, args, tmp_path, 7)
    assert stalled.stalled and stalled.code == 0 and stalled.checkpoint_ms == 2270.5
    text = dump.read_text()
    assert "job time" in text and "dashboard at" in text and "<module>" in text  # its stacks
    ordinary = one_run([*fake, ""], None, args, tmp_path, 8)
    assert not ordinary.stalled and ordinary.job_seconds is not None
    assert ordinary.job_seconds <= ordinary.seconds and not (tmp_path / "run-0008.txt").exists()


def test_the_checkpoint_figure_is_read_from_the_jobs_own_summary() -> None:
    line = "  checkpoints: 10 completed + final, 0 failed, median duration 139.1 ms"
    found = CHECKPOINTS.search(line)  # the line JobResult.summary() prints
    assert found is not None and float(found.group(1)) == 139.1
