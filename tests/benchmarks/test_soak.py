"""The soak's verdicts (benchmarks/soak.py) and the stall loop's process search
(benchmarks/stall_loop.py): pure parts, no job runs here."""

from __future__ import annotations

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

from soak import Series
from stall_loop import session_pythons


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
