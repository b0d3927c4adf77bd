"""Jobs on a real Spark standalone cluster (a master and two workers on 127.0.0.1, the
``standalone`` fixture), submitted the way the README says: ``python -m jobmanager submit
--master spark://...``, which ships the code as absflow.zip with ``--py-files``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.standalone import StandaloneCluster, result_fields, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent.parent
JOB = str(ROOT / "tests" / "integration" / "standalone_job.py")
TIMEOUT = 300.0


def submit_argv(cluster: StandaloneCluster, tmp_path: Path, *script: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "jobmanager",
        "submit",
        "--master",
        cluster.url,
        "--out",
        str(tmp_path / "dist"),
        "--conf",
        "spark.ui.enabled=false",
        *script,
    ]


def driver_env(cluster: StandaloneCluster) -> dict[str, str]:
    """No PYTHONPATH: the driver and the executors get absflow from the zip (the driver
    of ``python -m jobmanager`` itself from the checkout, its working directory)."""
    return dict(cluster.env(), PYSPARK_PYTHON=sys.executable)


def submit(cluster: StandaloneCluster, tmp_path: Path, *script: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        submit_argv(cluster, tmp_path, *script),
        cwd=ROOT,
        env=driver_env(cluster),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], cluster: StandaloneCluster) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the submitted job did not end\n{out[-3000:]}\n{err[-5000:]}")
    log = cluster.root / "drivers" / f"{os.getpid()}-{proc.pid}.log"  # kept for a post-mortem
    log.parent.mkdir(exist_ok=True)
    log.write_text(f"{out}\n{err}")
    assert proc.returncode == 0, f"{out[-3000:]}\n{err[-6000:]}\n{cluster.logs()}"
    return out, err


def test_wordcount_submitted_with_a_kill_gives_the_failure_free_output(
    standalone: StandaloneCluster, tmp_path: Path, spark: Any
) -> None:
    data = tmp_path / "data"
    # Long enough (~4 s of processing) that checkpoint 1 completes before the end even
    # when the full channels make aligned checkpoints take a second or more.
    common = ["--words", "2000000", "--data", str(data), "--checkpoint-interval", "0.2"]
    proc = submit(
        standalone,
        tmp_path,
        str(ROOT / "examples" / "wordcount.py"),
        *common,
        "--checkpoint-dir",
        str(tmp_path / "chk"),
        "--output",
        str(tmp_path / "killed.json"),
        "--kill-task",
        "count[1]",
        "--after",
        "chk1",
    )
    out, _err = finish(proc, standalone)
    line = out.splitlines()[0].split()
    assert line[line.index("--master") + 1] == standalone.url
    assert line[line.index("--py-files") + 1] == str(tmp_path / "dist" / "absflow.zip")
    assert "check against collections.Counter: OK" in out and "2,000,000 words counted" in out
    restarts = [x for x in out.splitlines() if x.strip().startswith("restart after attempt")]
    assert len(restarts) == 1 and "restored checkpoint" in restarts[0], out[-3000:]

    # The same job failure-free, in this process on the local session: the same records.
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import wordcount
    finally:
        sys.path.pop(0)
    assert wordcount.main([*common, "--output", str(tmp_path / "clean.json")]) == 0
    # Both files hold every (word, running count) record, sorted: equal bytes, equal records.
    killed, clean = (tmp_path / "killed.json").read_bytes(), (tmp_path / "clean.json").read_bytes()
    assert killed.count(b"],") + 1 == 2_000_000 and killed == clean


def newest_checkpoint(root: Path) -> int:
    done = [int(p.parent.name[4:]) for p in root.glob("chk-*/_metadata")]
    return max(done, default=0)


def test_a_lost_worker_is_replaced_and_the_job_recovers_exactly_once(
    standalone: StandaloneCluster, tmp_path: Path
) -> None:
    chk = tmp_path / "chk"
    proc = submit(standalone, tmp_path, JOB, "count", str(chk), "60000", "6000")
    try:
        wait_for(
            lambda: newest_checkpoint(chk) >= 2 or proc.poll() is not None,
            TIMEOUT,
            "the job's second checkpoint",
        )
        assert proc.poll() is None, "the job ended before a worker could be killed"
        victim = next(w for w in standalone.workers if w.proc.poll() is None)
        standalone.kill_worker(victim)  # its executor and Python workers go with it
        standalone.add_worker()  # the replacement the restart waits for
    finally:
        out, err = finish(proc, standalone)
    fields = result_fields(out)
    assert fields["records"] == fields["distinct"] == fields["total"] == "60000", out
    assert fields["restarts"] == "1" and int(fields["restored"]) >= 2, out
    # The restart waited for the replacement's slots: the job manager's own bounded wait,
    # or, when it looked before Spark had dropped the lost executor, Spark's slot re-check
    # (every second under python -m jobmanager submit).
    said = out + err  # the driver's log lines
    assert "waiting up to 120 s for executors: 2 of 4" in said or "requires 4 slots, but" in said
    inside = "absflow.zip/runtime/__init__.py"
    assert fields["driver_from"] == str(tmp_path / "dist" / inside)
    assert all(f.endswith(inside) for f in fields["tasks_from"].split(",")), fields


def test_more_tasks_than_slots_fail_within_seconds_naming_both(
    standalone: StandaloneCluster, tmp_path: Path
) -> None:
    assert standalone.slots() == 4
    out, _err = finish(submit(standalone, tmp_path, JOB, "slots"), standalone)
    assert result_fields(out)["error"] == "InsufficientSlotsError", out
    error = next(line for line in out.splitlines() if line.startswith("ERROR "))
    assert "the job has 6 tasks but the SparkSession has only 4 task slots" in error
    assert "after waiting 2 s for executors" in error
    assert float(result_fields(out)["seconds"]) < 15.0


def test_the_cluster_is_two_workers_on_loopback_with_its_files_under_its_root(
    standalone: StandaloneCluster,
) -> None:
    state = standalone.state()
    assert state["url"] == standalone.url and state["aliveworkers"] == 2
    workers = [w for w in state["workers"] if w["state"] == "ALIVE"]
    assert all(w["host"] == "127.0.0.1" and w["cores"] == 2 for w in workers)
    for worker in standalone.workers:
        assert f"--work-dir {standalone.root}/" in " ".join(worker.argv)
