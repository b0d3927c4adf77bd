"""The same code on a multi-executor cluster: local-cluster mode starts two executor JVMs,
each launching its own Python workers; tasks bind on their executor's address."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobmanager.packaging import build_zip

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


def test_spark_submit_runs_on_the_submitted_master_with_tasks_on_two_executor_jvms(
    tmp_path: Path,
) -> None:
    import pyspark

    spark_submit = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")
    env = dict(
        os.environ,
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_WORKER_DIR=str(tmp_path / "work"),
    )
    proc = subprocess.run(
        [
            spark_submit,
            "--master",
            "local-cluster[2,2,1024]",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            f"spark.worker.dir={tmp_path / 'work'}",
            "--py-files",
            str(build_zip(tmp_path)),
            os.path.join(ROOT, "tests", "integration", "submit_job.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    fields = dict(item.split("=") for item in lines[-1].split()[1:])
    assert fields == {
        "master": "local-cluster[2,2,1024]",
        "task_jvms": "2",
        "driver_jvm_ran_tasks": "False",
        "records": "4000",
        "total": "4000",
    }
