"""A task's counters and the `statebackend.metrics.TaskMetrics` read from them
(heartbeats, Finished).

The task owns one `TaskCounters` and bumps it per batch; `measure` runs once per
heartbeat, never per record, and reads the task's parts it is handed (the chain, the
output channels, the input queues, the sockets), not the task.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from runtime.control_client import peak_rss_bytes, rss_bytes
from statebackend.metrics import TaskMetrics

if TYPE_CHECKING:
    from runtime.chain import OperatorChain
    from runtime.feedback import FeedbackQueue
    from runtime.input_side import InputSide
    from runtime.inputs import BlockedChannels
    from runtime.overtaking import OvertakingInput
    from runtime.task_io import Output, TaskIO


@dataclass(slots=True)
class TaskCounters:
    """What a task counts as it runs (also the counters of loop termination detection)."""

    records_in: int = 0
    bytes_in: int = 0
    idle_seconds: float = 0.0
    opened_at: float = 0.0  # monotonic clock of open(), 0 before
    peak_rss: int = 0
    first_record_at: float = 0.0  # wall clock of the first record of this attempt, 0 if none
    aligned_pause_seconds: float = 0.0  # a source paused by watermark alignment

    def open(self) -> None:
        self.peak_rss, self.opened_at = rss_bytes(), time.monotonic()

    def measure(
        self,
        chain: OperatorChain,
        channels: Sequence[Output],
        queues: Sequence[FeedbackQueue | OvertakingInput | None],
        inputs: BlockedChannels | None,
        io: TaskIO,
        input_side: InputSide,
    ) -> TaskMetrics:
        """The metrics now; the peak RSS seen so far is kept (the kernel's high-water mark,
        so a peak between two measurements counts too)."""
        rss = rss_bytes()
        self.peak_rss = max(self.peak_rss, rss, peak_rss_bytes())
        present = [q for q in queues if q is not None]
        return TaskMetrics(
            records_in=self.records_in,
            records_out=chain.records_out,
            bytes_in=self.bytes_in,
            bytes_out=sum(ch.bytes_sent for ch in channels),
            backpressure_seconds=round(sum(ch.blocked_seconds for ch in channels), 6),
            idle_seconds=round(self.idle_seconds, 6),
            uptime_seconds=round(time.monotonic() - self.opened_at, 6) if self.opened_at else 0.0,
            input_queue=(inputs.buffered_total if inputs is not None else 0)
            + sum(len(q) for q in present),
            output_queue=sum(ch.pending_count for ch in channels),
            rss_bytes=rss,
            peak_rss=self.peak_rss,
            spilled_bytes=(inputs.spilled_total if inputs is not None else 0)
            + sum(q.spilled_bytes for q in present),
            first_record_at=self.first_record_at,
            watermark=watermark if math.isfinite(watermark := chain.watermark) else None,
            watermark_idle=chain.assigner is not None and chain.assigner.idle,
            aligned_pause_seconds=round(self.aligned_pause_seconds, 6),
            refused_connections=io.refused_connections,
            malformed_frames=input_side.malformed_frames,
        )
