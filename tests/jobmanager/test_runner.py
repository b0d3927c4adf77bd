"""The job manager without Spark: checkpoint storage (local and S3) checked before anything
starts, restart decisions (permanent, deterministic, strategy), the restart log line, Ctrl-C."""

from __future__ import annotations

import logging
import os
import time
import types
from pathlib import Path
from typing import Any

import pytest

from jobmanager import launcher
from jobmanager.failures import Failure, FailureCause
from jobmanager.restart import FixedDelay
from jobmanager.runner import JobManager, RestorePoint, open_checkpoint_storage
from runtime.config import JobConfig
from runtime.errors import (
    CheckpointStorageError,
    GraphError,
    InsufficientSlotsError,
    JobCancelledError,
    TaskFailedError,
)
from statebackend.storage import CheckpointStorage
from tests.conftest import FakeS3
from tests.jobmanager.fakes import small_plan

RAISED = Failure(
    FailureCause.USER_FUNCTION_RAISED, "split", 1, "ValueError: bad line", "Traceback: ..."
)


def read_only_dir(tmp_path: Path) -> str:
    """A directory this process cannot create files in (root ignores modes: use sysfs)."""
    if os.geteuid() != 0:
        path = tmp_path / "ro"
        path.mkdir()
        path.chmod(0o555)
        return str(path)
    if not os.path.isdir("/sys/kernel") or _writable("/sys/kernel"):
        pytest.skip("no read-only directory available to root")
    return "/sys/kernel"


def _writable(path: str) -> bool:
    try:
        open_checkpoint_storage(path)
        return True
    except CheckpointStorageError:
        return False


def counted_probes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The roots ``CheckpointStorage.probe`` is called for, from now on."""
    probes: list[str] = []
    probe = CheckpointStorage.probe

    def counted(self: CheckpointStorage) -> None:
        probes.append(self.root)
        probe(self)

    monkeypatch.setattr(CheckpointStorage, "probe", counted)
    return probes


def test_a_read_only_checkpoint_dir_fails_at_once_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = read_only_dir(tmp_path)
    probes = counted_probes(monkeypatch)
    with pytest.raises(CheckpointStorageError) as info:  # no launcher: nothing started
        JobManager(small_plan(), JobConfig(checkpoint_interval=0.1, checkpoint_dir=root), None, [])
    assert len(probes) == 1  # at once: one probe, no retry (a restart cannot fix it)
    message = str(info.value)
    assert root in message and "not writable" in message
    assert "Error" in message and "writable for the user" in message
    assert isinstance(info.value.__cause__, OSError)
    assert not [p for p in os.listdir(root) if p.startswith(".absflow-probe")]


@pytest.mark.parametrize("parent", ["/proc/absflow-no-such-dir", "file"])
def test_a_checkpoint_dir_under_a_missing_parent_is_a_clear_error(
    tmp_path: Path, parent: str
) -> None:
    if parent == "file":
        (tmp_path / "file").write_text("not a directory")
        parent = str(tmp_path / "file")
    root = os.path.join(parent, "chk")
    with pytest.raises(CheckpointStorageError) as info:
        open_checkpoint_storage(root)
    message = str(info.value)
    assert root in message and "cannot be created" in message
    assert "Create its parent directory" in message


def test_a_writable_checkpoint_dir_keeps_no_probe(tmp_path: Path) -> None:
    storage = open_checkpoint_storage(str(tmp_path / "chk"))
    assert os.listdir(storage.root) == []


def test_s3_storage_is_probed_on_the_driver_and_keeps_no_probe(s3: FakeS3, s3_root: str) -> None:
    storage = open_checkpoint_storage(s3_root, s3.options)
    assert storage.root == s3_root and storage.checkpoint_ids() == []
    listed = s3.client().list_objects_v2(Bucket=s3.bucket, Prefix=s3_root.split("/", 3)[3])
    assert listed.get("KeyCount", 0) == 0


def test_a_missing_bucket_fails_on_the_driver_naming_the_url(s3: FakeS3) -> None:
    config = JobConfig(
        checkpoint_interval=0.1,
        checkpoint_dir="s3://absflow-no-such-bucket/chk",
        storage_options=s3.options,
    )
    with pytest.raises(CheckpointStorageError) as info:
        JobManager(small_plan(), config, None, [])
    message = str(info.value)
    assert "s3://absflow-no-such-bucket/chk" in message and "bucket" in message
    assert "storage_options" in message  # the fix


def test_a_refusing_endpoint_fails_on_the_driver_at_once(
    s3: FakeS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = {
        **s3.options,
        "endpoint_url": "http://127.0.0.1:9",  # nothing listens on the discard port
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2},
    }
    probes = counted_probes(monkeypatch)
    with pytest.raises(CheckpointStorageError, match=r"s3://b/chk.*EndpointConnectionError"):
        open_checkpoint_storage("s3://b/chk", options)
    assert len(probes) <= 1  # at once: no retry (the root's existence check may fail first)


def test_storage_options_are_a_dict_and_stay_out_of_the_repr() -> None:
    config = JobConfig(storage_options={"secret": "hunter2"})
    assert "hunter2" not in repr(config)
    with pytest.raises(GraphError, match="storage_options must be a dict"):
        JobConfig(storage_options=[("key", "x")])  # type: ignore[arg-type]


def manager(tmp_path: Path, **config: Any) -> JobManager:
    cfg = JobConfig(checkpoint_interval=0.1, checkpoint_dir=str(tmp_path / "chk"), **config)
    return JobManager(small_plan(), cfg, None, [])


def test_a_failure_is_restarted_and_the_log_line_says_where_and_what(
    tmp_path: Path, caplog: Any
) -> None:
    jm = manager(tmp_path)
    with caplog.at_level(logging.WARNING, logger="absflow"):
        restore, delay = jm._recover(RAISED, 0, None, 123.0)
    assert restore is None and delay == pytest.approx(0.1)
    assert caplog.messages == [
        "attempt 0 failed (a user function raised in operator 'split' (subtask 1): "
        "ValueError: bad line); restarting from the start in 0.10 s"
    ]
    r = jm.metrics.restarts[0]
    assert (r.attempt, r.cause, r.error, r.failed_at) == (
        0,
        FailureCause.USER_FUNCTION_RAISED,
        "ValueError: bad line",
        123.0,
    )
    assert "raised" in r.reason


def test_the_same_failure_twice_after_the_same_checkpoint_is_not_retried(tmp_path: Path) -> None:
    jm = manager(tmp_path)
    point = RestorePoint(jm.storage, 3, {})  # type: ignore[arg-type]
    jm._recover(RAISED, 0, None, 0.0)
    jm._recover(RAISED, 1, point, 0.0)
    second = Failure(FailureCause.USER_FUNCTION_RAISED, "split", 0, "ValueError: bad line", "tb2")
    with pytest.raises(TaskFailedError) as info:
        jm._recover(second, 2, point, 0.0)
    message = str(info.value)
    assert message.startswith(
        "job 'job' failed after 2 restart(s): a user function raised in operator 'split' "
        "(subtask 1): ValueError: bad line; it failed the same way twice after restoring "
        "checkpoint 3: not retried, a restart cannot fix it"
    )
    assert info.value.remote_traceback == "Traceback: ..."  # the first error's
    assert len(jm.metrics.restarts) == 2


def test_a_permanent_failure_is_not_retried_and_says_why(tmp_path: Path) -> None:
    jm = manager(tmp_path)
    fatal = Failure(
        FailureCause.TASK_ERROR, "src[0]", 0, "RuntimeError: no fit", permanent="it cannot fit"
    )
    with pytest.raises(TaskFailedError) as info:
        jm._recover(fatal, 0, None, 0.0)
    assert "; not retried: it cannot fit" in str(info.value)
    assert "restart" not in str(info.value).split(";")[0]
    assert jm.metrics.restarts == []


def test_an_exhausted_strategy_names_itself(tmp_path: Path) -> None:
    jm = manager(tmp_path, restart_strategy=FixedDelay(attempts=1, delay=0.0))
    died = Failure(FailureCause.TASK_DIED, "count", 1, "task count[1] (pid 7) is gone")
    jm._recover(died, 0, None, 0.0)
    with pytest.raises(TaskFailedError) as info:
        jm._recover(died, 1, None, 0.0)
    assert "after 1 restart(s)" in str(info.value)
    assert "; restart strategy gave up: fixed delay (1 restarts, 0.0 s apart)" in str(info.value)


def test_ctrl_c_raises_job_cancelled_without_a_chain_and_leaves_no_dirs(
    monkeypatch: Any,
) -> None:
    def interrupted(*_args: Any, **_kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher, "ensure_session", interrupted)
    jm = JobManager(small_plan(), JobConfig(checkpoint_interval=0.1), None, [])
    owned = list(jm.owned_dirs)
    assert owned and all(os.path.isdir(d) for d in owned)
    with pytest.raises(JobCancelledError) as info:
        jm.run()
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert "cancelled" in str(info.value)
    assert not any(os.path.exists(d) for d in owned)


class ScriptedAttempts:
    """``JobManager._run_attempt`` replaced: attempt n fails while n < failures (a task
    dying, so that the repeated-failure rule does not stop the restarts)."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.run: list[int] = []

    def __call__(self, _launcher: Any, number: int, *_args: Any) -> Any:
        self.run.append(number)
        died = Failure(FailureCause.TASK_DIED, "count", number, f"task count[{number}] is gone")
        failure = died if number < self.failures else None
        return type("FakeAttempt", (), {"failure": failure, "killed_at": None, "rescue": None})()


class FakeSession:
    sparkContext = object()


class RecordingDashboard:
    """What the job manager tells the dashboard between attempts."""

    def __init__(self) -> None:
        self.said: list[str] = []

    def restarting(self, message: str) -> None:
        self.said.append(message)


def with_dashboard(jm: JobManager) -> RecordingDashboard:
    """The run services ``_attempts`` uses, as ``_run`` would have made them."""
    board = RecordingDashboard()
    jm.services = types.SimpleNamespace(dashboard=board)  # type: ignore[assignment]
    return board


def spark_launcher() -> launcher.SparkBarrierLauncher:
    """The Spark launcher as ``prepare`` leaves it, on a fake session."""
    spark = launcher.SparkBarrierLauncher()
    spark.spark = FakeSession()
    return spark


def test_a_restart_waits_for_slots_and_fails_clearly_when_they_do_not_come(
    tmp_path: Path, monkeypatch: Any
) -> None:
    waits: list[tuple[int, float]] = []

    def no_slots(_sc: Any, needed: int, wait: float, **_kw: Any) -> int:
        waits.append((needed, wait))
        raise InsufficientSlotsError(f"the job has {needed} tasks but only 2 slots")

    monkeypatch.setattr(launcher, "check_slots", no_slots)
    jm = manager(tmp_path, executor_wait=3.0, restart_strategy=FixedDelay(attempts=2, delay=0.0))
    board = with_dashboard(jm)
    attempts = ScriptedAttempts(failures=1)
    monkeypatch.setattr(jm, "_run_attempt", attempts)
    with pytest.raises(InsufficientSlotsError) as info:
        jm._attempts(spark_launcher(), time.monotonic())
    assert str(info.value).startswith(
        "job 'job' cannot restart after attempt 0 failed (a task process died (killed or "
        "crashed) in operator 'count' (subtask 0): task count[0] is gone): the job has"
    )
    assert str(info.value).endswith("but only 2 slots")
    assert attempts.run == [0]  # the restart was never submitted
    assert waits == [(len(jm.plan.tasks), 3.0)]
    assert board.said and "task slots" in board.said[0]  # the dashboard says what it waits for


def test_a_restart_goes_ahead_once_the_slots_are_back(tmp_path: Path, monkeypatch: Any) -> None:
    waits: list[int] = []

    def slots_back(_sc: Any, needed: int, **_kw: Any) -> int:
        waits.append(needed)
        return needed

    monkeypatch.setattr(launcher, "check_slots", slots_back)
    jm = manager(tmp_path, restart_strategy=FixedDelay(attempts=3, delay=0.0))
    board = with_dashboard(jm)
    attempts = ScriptedAttempts(failures=2)
    monkeypatch.setattr(jm, "_run_attempt", attempts)
    result = jm._attempts(spark_launcher(), time.monotonic())
    assert attempts.run == [0, 1, 2] and len(waits) == 2
    assert len(result.restarts) == 2 and len(board.said) == 2
