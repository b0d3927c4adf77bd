"""Checkpoints on S3 (moto's server on loopback) with local Spark: a SIGKILLed task
recovers from an S3 checkpoint with the failure-free output, a new run restores from
an S3 checkpoint, the CLI lists them, and storage a task cannot write fails the job at
once naming the URL and the host."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jobmanager import runner
from jobmanager.faults import Kill
from runtime import TaskFailedError
from statebackend.storage import CheckpointStorage
from tests.conftest import FakeS3
from tests.integration.topologies import final_counts, pipeline, pipeline_expected

# s3 first: its server's port is there before no_leaks looks, and stays after
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("s3", "no_leaks"),
]

REPO = Path(__file__).resolve().parents[2]
N = 16_000


def on_s3(s3: FakeS3, root: str) -> dict[str, Any]:
    return {"checkpoint_interval": 0.1, "checkpoint_dir": root, "storage_options": s3.options}


def test_a_killed_task_recovers_from_s3_then_a_new_run_restores_and_the_cli_lists(
    s3: FakeS3, s3_root: str
) -> None:
    reference = pipeline(N, rate=None, **on_s3(s3, f"{s3_root}-reference")).run()
    assert collections.Counter(reference.output("out")) == pipeline_expected(N)

    # ~5 s of input: the first checkpoint of fresh task processes also builds their S3
    # client, which can take seconds on a busy machine; the kill needs a second one.
    result = pipeline(N, rate=3_000, **on_s3(s3, s3_root)).run(
        faults=[Kill("count[1]", after_checkpoint=2)]
    )
    assert len(result.restarts) == 1, result.summary()
    assert result.restarts[0].restored_checkpoint is not None
    assert collections.Counter(result.output("out")) == collections.Counter(reference.output("out"))
    storage = CheckpointStorage(s3_root, storage_options=s3.options)
    completed = storage.completed_checkpoints()
    assert 1 <= len(completed) <= 3 and storage.check(completed[-1]).final

    # A new run (twice the input) continues from the final S3 checkpoint of that one:
    # the counts go on from the restored ones, over exactly the N new records. (The
    # checkpoint's pre-committed sink output is committed again into the new run.)
    resumed = pipeline(2 * N, rate=None, **on_s3(s3, f"{s3_root}-resumed")).run(
        restore_from=s3_root
    )
    assert resumed.restarts == []
    restored_counts = final_counts(result.output("out"))
    new = [(k, c) for k, c in resumed.output("out") if c > restored_counts[k]]
    assert collections.Counter(new) == pipeline_expected(2 * N) - pipeline_expected(N)
    committed_again = collections.Counter(resumed.output("out")) - collections.Counter(new)
    assert committed_again <= collections.Counter(result.output("out"))

    listed = cli(s3_root, [arg for k, v in s3.options.items() for arg in option(k, v)])
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()[3:]]
    assert [(int(r[0]), r[1]) for r in rows] == [(n, "completed") for n in completed]
    # The same through fsspec's own environment variable (no --storage-option).
    env_listed = cli(s3_root, [], FSSPEC_S3=json.dumps(s3.options))
    assert env_listed.returncode == 0, env_listed.stderr
    assert env_listed.stdout == listed.stdout


def option(key: str, value: Any) -> list[str]:
    text = value if isinstance(value, str) else json.dumps(value)
    return ["--storage-option", f"{key}={text}"]


def cli(root: str, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobmanager", "checkpoints", root, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        timeout=120,
    )


def test_storage_a_task_cannot_write_fails_the_job_naming_the_url_and_host(
    s3: FakeS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver probe passes (bypassed here, as when only the driver reaches the
    storage); the tasks' first state writes fail: one fatal failure, no restarts.
    Every task state goes to a file here: a state small enough to travel inline in the
    ack never touches the storage from the task, so a task finds out at its first state
    that does not fit in the ack."""

    def unprobed(root: str, options: Any = None) -> CheckpointStorage:
        return CheckpointStorage(root, storage_options=options)

    monkeypatch.setattr(runner, "open_checkpoint_storage", unprobed)
    url = "s3://absflow-no-such-bucket/chk"
    with pytest.raises(TaskFailedError) as info:
        pipeline(N, **on_s3(s3, url), state_inline_threshold=0, timeout=90).run()
    message = str(info.value)
    assert f"checkpoint storage {url!r}" in message and " on host " in message
    assert "not retried" in message and "restart(s)" not in message
    assert "bucket" in message
