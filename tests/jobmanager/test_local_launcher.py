"""The local launcher's own decisions (``jobmanager.local_launcher``), without processes:
which settings it refuses, when the fork server preloads a job's modules, and how a task
process's end is put into words. Its processes are tested through the harness's pipelines
(tests/integration/test_harness.py, tests/jobmanager/test_fork_server.py)."""

from __future__ import annotations

import signal
from typing import IO, Any

import pytest

from jobmanager.local_launcher import PRELOAD_VAR, LocalStage, check_config, preloads
from runtime.config import JobConfig
from runtime.errors import GraphError


@pytest.mark.parametrize("setting", [{"local_master": "local[4]"}, {"executor_wait": 1.0}])
def test_a_spark_setting_is_refused_naming_it_and_the_fix(setting: dict[str, Any]) -> None:
    with pytest.raises(GraphError) as err:
        check_config(JobConfig(**setting))
    (name,) = setting
    assert f"{name}=" in str(err.value) and "launcher='spark'" in str(err.value)


def test_the_defaults_and_the_local_settings_pass() -> None:
    check_config(JobConfig())
    check_config(JobConfig(fork_server=False, fork_preload=True, checkpoint_interval=0.1))


@pytest.mark.parametrize(
    ("setting", "env", "expected"),
    [
        (None, None, False),  # off by default
        (None, "1", True),
        (None, "true", True),
        (None, "0", False),
        (None, "", False),
        (False, "1", False),  # the setting wins over the variable
        (True, None, True),
    ],
)
def test_preloading_follows_the_setting_else_the_variable(
    monkeypatch: pytest.MonkeyPatch, setting: bool | None, env: str | None, expected: bool
) -> None:
    if env is None:
        monkeypatch.delenv(PRELOAD_VAR, raising=False)
    else:
        monkeypatch.setenv(PRELOAD_VAR, env)
    assert preloads(JobConfig(fork_preload=setting)) is expected


class Ended:
    """A task process as the launcher sees it (``TaskProcess``), ended with ``code``."""

    def __init__(self, code: int | None) -> None:
        self.pid, self.returncode = 1, code
        self.stdin: IO[bytes] | None = None

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        """Nothing to end."""


def test_a_task_processs_end_is_put_in_the_words_failures_classify() -> None:
    assert LocalStage._exit_words(Ended(None)) == "still running"
    assert LocalStage._exit_words(Ended(-signal.SIGKILL)) == "killed by SIGKILL"
    assert LocalStage._exit_words(Ended(3)) == "exit code 3"
