"""What every task of an attempt is handed (runtime/task_environment.py): the fault
kinds as users write their moments, and the storage opened with the job's settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from channels.security import ChannelKeys
from runtime.config import JobConfig
from runtime.task_environment import FaultKind, TaskEnvironment


def test_the_tasks_open_their_storage_with_the_jobs_setting(tmp_path: Path) -> None:
    for setting in (False, True):
        config = JobConfig(snapshot_compression=setting)
        env = TaskEnvironment("tcp://127.0.0.1:1", 0, config, str(tmp_path), None, None)
        assert env.open_storage(str(tmp_path)).compression is setting


def test_the_storage_gets_the_jobs_inline_threshold_and_storage_options(tmp_path: Path) -> None:
    config = JobConfig(state_inline_threshold=4096, storage_options={"anon": True})
    env = TaskEnvironment("tcp://127.0.0.1:1", 0, config, str(tmp_path), None, None)
    storage = env.open_storage(str(tmp_path / "other"))
    assert storage.root == str(tmp_path / "other")
    assert storage.inline_threshold == 4096 and storage.storage_options == {"anon": True}


@pytest.mark.parametrize(
    ("moment", "kind"),
    [
        ("alignment", FaultKind.KILL_DURING_ALIGNMENT),
        ("snapshot", FaultKind.KILL_DURING_SNAPSHOT),
        ("backedge_log", FaultKind.KILL_DURING_BACKEDGE_LOG),
        ("compaction", FaultKind.KILL_DURING_COMPACTION),
        ("raise_at_record", None),  # a raise, not a kill
        ("Alignment", None),
        ("never", None),
    ],
)
def test_a_kill_is_named_by_its_moment(moment: str, kind: FaultKind | None) -> None:
    assert FaultKind.kill_during(moment) is kind


def test_the_moments_are_those_of_the_kills() -> None:
    assert FaultKind.moments() == ("alignment", "snapshot", "backedge_log", "compaction")
    assert all(FaultKind.kill_during(m) is not None for m in FaultKind.moments())


def test_the_channel_keys_stay_out_of_the_repr() -> None:
    keys = ChannelKeys.generate()
    env = TaskEnvironment("tcp://h:1", 0, JobConfig(), None, None, None, channel_keys=keys)
    assert "channel_keys" not in repr(env) and env.channel_keys is keys
    assert keys.server_secret.decode() not in repr(env)
