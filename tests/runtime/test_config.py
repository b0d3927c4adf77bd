"""A job's settings (runtime/config.py): unknown names and bad values are refused naming the
setting and the fix, names become enums, and the derived switches say what a run does."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.api.dataflow import Dataflow
from runtime.config import JobConfig, OptimisticRecovery, SnapshotMode, SuperstepCheckpointStyle
from runtime.errors import GraphError
from runtime.iterations.library import pagerank_compensation


def test_unknown_job_config_setting() -> None:
    with pytest.raises(
        GraphError, match=r"unknown setting\(s\) \['bogus'\]; known: .*checkpoint_interval"
    ):
        Dataflow("cfg", bogus=1)


def test_unknown_setting_in_replace() -> None:
    flow = Dataflow("cfg")
    with pytest.raises(GraphError, match=r"unknown setting\(s\) \['bogus'\]"):
        flow.config.replace(bogus=1)


def test_bad_config_values() -> None:
    with pytest.raises(GraphError, match="snapshot_mode 'sometimes'"):
        Dataflow("cfg", snapshot_mode="sometimes")
    with pytest.raises(
        GraphError, match="superstep_checkpoint_style 'middle' is unknown; use one of 'blocking'"
    ):
        Dataflow("cfg", superstep_checkpoint_style="middle")
    with pytest.raises(GraphError, match="checkpoint_interval must be > 0"):
        Dataflow("cfg", checkpoint_interval=0)
    with pytest.raises(GraphError, match="batch_size must be an int >= 1"):
        Dataflow("cfg", batch_size=0)


def test_optimistic_settings_are_checked() -> None:
    with pytest.raises(GraphError, match="needs a compensation function"):
        OptimisticRecovery(None)
    with pytest.raises(GraphError, match="max_lost_fraction"):
        OptimisticRecovery(pagerank_compensation, max_lost_fraction=1.5)


@pytest.mark.parametrize(
    ("setting", "bad", "match"),
    [
        ("launcher", "yarn", "launcher 'yarn' is unknown; use one of"),
        ("aligned_timeout", -1, "aligned_timeout must be >= 0 seconds"),
        ("max_inflight_time", 0, "max_inflight_time must be > 0 seconds"),
        ("alignment_interval", 0, "alignment_interval must be > 0 seconds, got 0"),
        ("superstep_checkpoint_interval", True, "superstep_checkpoint_interval must be a whole"),
        ("channel_hwm", 0, "channel_hwm must be an int >= 1, got 0"),
        ("socket_buffer", -1, r"socket_buffer must be an int >= 0 \(bytes; 0 for the OS default\)"),
        ("incremental_min_keys", False, "incremental_min_keys must be an int >= 0"),
        ("state_backend", "leveldb", "state_backend must be one of"),
        ("state_memory_budget_mb", 0, "state_memory_budget_mb must be a number of MiB > 0"),
        ("secure_channels", "yes", "secure_channels must be True, False or None"),
        ("ui_host", "", "ui_host must be a host name"),
        ("optimistic_recovery", "pagerank", "optimistic_recovery must be a runtime.config"),
    ],
)
def test_a_bad_value_names_the_setting_and_what_it_takes(
    setting: str, bad: Any, match: str
) -> None:
    with pytest.raises(GraphError, match=match):
        JobConfig(**{setting: bad})


def test_names_become_enums() -> None:
    config = JobConfig(snapshot_mode="unaligned", superstep_checkpoint_style="tail")
    assert config.snapshot_mode is SnapshotMode.UNALIGNED
    assert config.superstep_checkpoint_style is SuperstepCheckpointStyle.TAIL


@pytest.mark.parametrize(
    ("settings", "channel_state", "overtake"),
    [
        ({}, False, False),
        ({"snapshot_mode": "at_least_once"}, False, False),
        ({"snapshot_mode": "unaligned"}, True, True),
        ({"aligned_timeout": 0.5}, True, False),  # aligns first, may turn unaligned
        ({"snapshot_mode": "unaligned", "aligned_timeout": 0.5}, True, False),
        ({"snapshot_mode": "unaligned", "aligned_timeout": 0}, True, True),
    ],
)
def test_which_modes_log_channel_state_and_let_barriers_overtake(
    settings: dict[str, Any], channel_state: bool, overtake: bool
) -> None:
    config = JobConfig(**settings)
    assert (config.records_channel_state, config.barriers_overtake) == (channel_state, overtake)


def test_an_aligned_timeout_needs_a_mode_that_aligns() -> None:
    with pytest.raises(GraphError, match="'at_least_once' has no alignment: drop aligned_timeout"):
        JobConfig(snapshot_mode="at_least_once", aligned_timeout=1.0)


def test_checkpointing_is_on_with_any_kind_of_checkpoint() -> None:
    assert not JobConfig(checkpoint_interval=None).checkpointing
    assert JobConfig(checkpoint_interval=2.0).checkpointing
    assert JobConfig(checkpoint_interval=None, superstep_checkpoint_interval=3).checkpointing
    rescue = OptimisticRecovery(pagerank_compensation)
    assert JobConfig(checkpoint_interval=None, optimistic_recovery=rescue).checkpointing


@pytest.mark.parametrize(
    ("setting", "remote", "secure"),
    [(None, False, False), (None, True, True), (False, True, False), (True, False, True)],
)
def test_channels_are_secured_when_asked_else_when_tasks_may_be_remote(
    setting: bool | None, remote: bool, secure: bool
) -> None:
    assert JobConfig(secure_channels=setting).secures_channels(remote) is secure


def test_replace_checks_the_new_values_and_keeps_the_rest() -> None:
    config = JobConfig(batch_size=10, channel_hwm=4)
    changed = config.replace(batch_size=20)
    assert (changed.batch_size, changed.channel_hwm, config.batch_size) == (20, 4, 10)
    with pytest.raises(GraphError, match="batch_size must be an int >= 1"):
        config.replace(batch_size=0)
