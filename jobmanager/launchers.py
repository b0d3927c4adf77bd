"""How the job manager runs an attempt's tasks: the `Launcher` seam.

* ``spark`` (`jobmanager.launcher.SparkBarrierLauncher`, the default): every attempt is
  one Spark barrier stage; the product's way to run a job, locally or on a cluster;
* ``local`` (`jobmanager.local_launcher.LocalProcessLauncher`): every task is a local
  Python process started by the job manager, without Spark or a JVM; the test harness
  (``runtime.api.testing``) for unit tests of a pipeline.

Both run the same task entry (``runtime.task_entry.run_task``), the same operators,
ZeroMQ channels, checkpoints and restarts; the job manager sees only this protocol and
the `Stage` (``jobmanager.services``) a launcher starts per attempt.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Protocol

from jobmanager.services import Stage
from runtime.config import LAUNCHERS, JobConfig
from runtime.errors import GraphError
from runtime.plan import JobPlan
from runtime.task_environment import TaskEnvironment

__all__ = ["ENV_VAR", "Launcher", "launcher_name", "select_launcher"]

ENV_VAR = "ABSFLOW_LAUNCHER"


class Launcher(Protocol):
    """Starts the task processes of each attempt of one run."""

    name: str
    host: str  # the address the job manager binds its control socket on (after prepare)
    local_hosts: set[str]  # task hosts whose processes the job manager can signal
    remote: bool  # tasks may run on other hosts (secure_channels is on by default then)

    @property
    def refused_connections(self) -> int:
        """Connections its own sockets (a rendezvous) refused for want of the job's keys."""
        ...

    def prepare(self, tasks: int, config: JobConfig, say: Callable[[str], None]) -> None:
        """Before the first attempt: raise a clear error for what cannot run."""
        ...

    def before_restart(self, tasks: int, config: JobConfig, say: Callable[[str], None]) -> None:
        """Before a restart: raise InsufficientSlotsError when the tasks cannot start."""
        ...

    def start(self, plan: JobPlan, env: TaskEnvironment, group: str) -> Stage:
        """Start every task of one attempt (``env.attempt``); returns at once."""
        ...

    def close(self) -> None:
        """After the run (every stage has ended)."""
        ...


def launcher_name(config: JobConfig) -> str:
    """``config.launcher``, else ``$ABSFLOW_LAUNCHER``, else ``spark``."""
    if config.launcher is not None:
        return config.launcher
    name = os.environ.get(ENV_VAR, "").strip() or "spark"
    if name not in LAUNCHERS:
        raise GraphError(
            f"{ENV_VAR}={name!r} is not a launcher; use one of {', '.join(LAUNCHERS)} "
            f"(or unset it: the default is spark)."
        )
    return name


def select_launcher(config: JobConfig) -> Launcher:
    name = launcher_name(config)
    if name == "local":
        from jobmanager.local_launcher import LocalProcessLauncher

        return LocalProcessLauncher()
    from jobmanager.launcher import SparkBarrierLauncher

    return SparkBarrierLauncher()
