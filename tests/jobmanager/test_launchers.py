"""Which launcher runs a job's tasks (jobmanager/launchers.py): the job's setting, else
``$ABSFLOW_LAUNCHER``, else Spark; a bad name is refused naming the fix. Building a
launcher does no I/O (nothing starts before ``prepare``)."""

from __future__ import annotations

import pytest

from jobmanager.launcher import SparkBarrierLauncher
from jobmanager.launchers import ENV_VAR, launcher_name, select_launcher
from jobmanager.local_launcher import LocalProcessLauncher
from runtime.config import JobConfig
from runtime.errors import GraphError


@pytest.mark.parametrize(
    ("setting", "env", "name"),
    [
        (None, None, "spark"),
        (None, "local", "local"),
        (None, "  local\n", "local"),
        (None, "", "spark"),
        ("spark", "local", "spark"),  # the job's own setting wins
        ("local", None, "local"),
    ],
)
def test_the_setting_then_the_environment_then_spark(
    monkeypatch: pytest.MonkeyPatch, setting: str | None, env: str | None, name: str
) -> None:
    if env is None:
        monkeypatch.delenv(ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(ENV_VAR, env)
    assert launcher_name(JobConfig(launcher=setting)) == name


def test_a_bad_environment_value_names_the_variable_and_the_choices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_VAR, "yarn")
    with pytest.raises(GraphError, match=r"ABSFLOW_LAUNCHER='yarn' is not a launcher; use one of"):
        launcher_name(JobConfig())


def test_select_builds_the_named_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    local = select_launcher(JobConfig(launcher="local"))
    assert isinstance(local, LocalProcessLauncher) and not local.remote
    spark = select_launcher(JobConfig())
    assert isinstance(spark, SparkBarrierLauncher) and spark.spark is None  # no session yet
