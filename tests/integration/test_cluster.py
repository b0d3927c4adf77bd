"""The same code on a multi-executor cluster: local-cluster mode starts two executor JVMs,
each launching its own Python workers; tasks bind on their executor's address."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_job_with_a_kill_on_two_executor_jvms() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.integration.cluster_job"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    fields = dict(item.split("=") for item in lines[-1].split()[1:])
    assert fields == {"records": "20000", "distinct": "20000", "total": "20000", "restarts": "1"}
