"""What an attempt works with: the job manager's row per task (`TaskInfo`) and the
services every attempt of a run shares (`RunServices`: the ROUTER link, liveness, the
fault schedule, metrics, committed outputs, progress), typed as protocols so an attempt
runs against fakes in a unit test.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from jobmanager.fault_schedule import FaultSchedule
from jobmanager.liveness import Liveness, send_signal
from jobmanager.metrics import CommittedOutputs, RunMetrics
from jobmanager.stop import StopRequest
from runtime import control as P
from statebackend.metrics import TaskMetrics

__all__ = ["ControlLink", "Progress", "RunServices", "Stage", "TaskInfo"]


@dataclass
class TaskInfo:
    """What the job manager knows of one task of the running attempt."""

    task_id: str
    subtask: int
    pid: int = 0
    host: str = ""
    endpoint: str = ""
    last_seen: float = 0.0
    records_in: int = 0
    records_out: int = 0
    rss: int = 0
    peak_rss: int = 0
    first_record_at: float = 0.0  # wall clock; 0 until the task reports one
    finished: bool = False
    closed: bool = False
    metrics: TaskMetrics = field(default_factory=TaskMetrics)  # the last heartbeat's

    @property
    def operator(self) -> str:
        """The chain's name, as in the task id ``count[1]``."""
        return self.task_id.rpartition("[")[0] or self.task_id


class ControlLink(Protocol):
    """The job manager's end of the control plane (the ROUTER)."""

    def receive(self, timeout_ms: int) -> Iterator[P.Message]:
        """Every message waiting, after waiting up to ``timeout_ms`` for one."""
        ...

    def send(self, task_index: int, attempt: int, msg: P.Message) -> None:
        """To one task of one attempt; never blocks, drops what cannot be delivered."""
        ...


class Stage(Protocol):
    """An attempt's running tasks: a Spark barrier stage (``launcher.StageRunner``) or
    local task processes (``local_launcher.LocalStage``); see ``jobmanager.launchers``."""

    outcome: queue.Queue[BaseException | None]

    def cancel(self) -> None: ...

    def join(self, timeout: float) -> bool: ...


class Progress(Protocol):
    def update(
        self,
        records_in: int,
        records_out: int,
        checkpoints: int,
        restarts: int,
        last_checkpoint_ms: float | None,
        superstep: int | None = None,
    ) -> None: ...


class Publisher(Protocol):
    """Where an attempt publishes its state for the dashboard (``jobmanager.web``); called
    on every turn of the attempt's loop, it throttles itself."""

    def publish(self, attempt: Any) -> None: ...


class _NoDashboard:
    def publish(self, attempt: Any) -> None:
        pass


NO_DASHBOARD: Publisher = _NoDashboard()


@dataclass
class RunServices:
    """What every attempt of a run shares."""

    link: ControlLink
    liveness: Liveness
    faults: FaultSchedule
    metrics: RunMetrics
    outputs: CommittedOutputs
    progress: Progress
    signal_process: Callable[[int, int], None] = send_signal
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    dashboard: Publisher = field(default_factory=lambda: NO_DASHBOARD)
    stop: StopRequest = field(default_factory=StopRequest)
