"""The README's main job, run in-process on the shared session (small corpus)."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import pytest

from jobmanager import launcher
from runtime import InsufficientSlotsError

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leaks")]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_example(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(ROOT, "examples", f"{name}.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_wordcount_example_checks_its_counts(tmp_path: Any, capsys: Any) -> None:
    wordcount = load_example("wordcount")
    assert (
        wordcount.main(
            ["--words", "60000", "--data", str(tmp_path), "--checkpoint-interval", "0.2"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "check against collections.Counter: OK" in out and "60,000 words counted" in out


@pytest.mark.slow
def test_wordcount_example_chaos_compares_with_a_clean_run(tmp_path: Any, capsys: Any) -> None:
    wordcount = load_example("wordcount")
    code = wordcount.main(
        [
            "--words",
            "400000",
            "--data",
            str(tmp_path),
            "--checkpoint-interval",
            "0.1",
            "--chaos",
            "1",
            "--seed",
            "3",
        ]
    )
    out = capsys.readouterr().out
    assert "output equals the failure-free run record for record: YES" in out, out
    assert code == 0


def test_too_few_slots_fail_fast_with_a_clear_error(spark: Any) -> None:
    with pytest.raises(InsufficientSlotsError) as info:
        launcher.check_slots(spark.sparkContext, 1000)
    message = str(info.value)
    assert "1000 tasks" in message and "slot" in message and "local[1000]" in message


def test_a_job_needing_more_slots_than_the_active_session_fails_before_submitting(
    spark: Any, monkeypatch: Any
) -> None:
    from runtime import Dataflow
    from runtime.sources import CollectionSource

    # The test session is absflow's own (it would grow it); pretend it is the user's.
    monkeypatch.setattr(launcher, "_owned_session", None)
    flow = Dataflow("wide", parallelism=40, checkpoint_interval=1.0)
    flow.source(CollectionSource(range(10)), name="items").collect()
    with pytest.raises(InsufficientSlotsError) as info:
        flow.run()
    assert "40 tasks" in str(info.value)


@pytest.mark.slow
def test_ctrl_c_stops_the_example_with_a_savepoint_without_a_traceback(tmp_path: Any) -> None:
    import signal
    import subprocess
    import sys
    import time

    chk = tmp_path / "chk"
    proc = subprocess.Popen(
        [
            sys.executable,
            os.path.join(ROOT, "examples", "wordcount.py"),
            "--words",
            "3000000",
            "--data",
            str(tmp_path / "data"),
            "--checkpoint-dir",
            str(chk),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not list(chk.glob("chk-*/_metadata")) and proc.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint completed within 180 s"
            time.sleep(0.05)
        assert proc.poll() is None, "the job ended before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-2000:] + err[-3000:]
    assert "stopped with savepoint" in out and "Traceback" not in err, out[-2000:] + err[-3000:]
    assert "--restore-from" in out


def test_collatz_example_checks_its_result(capsys: Any) -> None:
    collatz = load_example("collatz")
    assert collatz.main(["--n", "2000", "--checkpoint-interval", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "check against a direct computation, record for record: OK" in out, out


@pytest.mark.slow
def test_connected_components_example_survives_a_kill_of_a_loop_task(capsys: Any) -> None:
    cc = load_example("connected_components")
    code = cc.main(
        [
            "--vertices",
            "3000",
            "--edges",
            "2400",
            "--checkpoint-interval",
            "0.1",
            "--kill-task",
            "propagate[1]",
            "--after",
            "chk2",
        ]
    )
    out = capsys.readouterr().out
    assert "check against union-find: OK; no duplicate updates: OK" in out, out
    assert "restart after attempt 0" in out, out
    assert code == 0
