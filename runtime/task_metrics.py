"""A task's `statebackend.metrics.TaskMetrics` from its counters (heartbeats, Finished).

Everything here is read from counters the task and its channels keep per batch; this
runs once per heartbeat, never per record.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from runtime.control_client import rss_bytes
from statebackend.metrics import TaskMetrics

if TYPE_CHECKING:
    from runtime.task import Task


def measure_task(task: Task) -> TaskMetrics:
    rss = rss_bytes()
    channels = task.channels
    queues = [q for q in (task.feedback, task.overtaking) if q is not None]
    inputs = task.inputs
    return TaskMetrics(
        records_in=task.records_in,
        records_out=task.chain.records_out,
        bytes_in=task.bytes_in,
        bytes_out=sum(ch.bytes_sent for ch in channels),
        backpressure_seconds=round(sum(ch.blocked_seconds for ch in channels), 6),
        idle_seconds=round(task.idle_seconds, 6),
        uptime_seconds=round(time.monotonic() - task.opened_at, 6) if task.opened_at else 0.0,
        input_queue=(inputs.buffered_total if inputs is not None else 0)
        + sum(len(q) for q in queues),
        output_queue=sum(ch.pending_count for ch in channels),
        rss_bytes=rss,
        peak_rss=max(task.peak_rss, rss),
        spilled_bytes=(inputs.spilled_total if inputs is not None else 0)
        + sum(q.spilled_bytes for q in queues),
        first_record_at=task.first_record_at,
        watermark=watermark if math.isfinite(watermark := task.chain.watermark) else None,
        refused_connections=task.io.refused_connections,
        malformed_frames=task.input_side.malformed_frames,
    )
