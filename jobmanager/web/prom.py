"""``/metrics``: a job's latest snapshot in the Prometheus text format, through
``prometheus_client``. Each job has its own ``CollectorRegistry`` (never the global one),
so several jobs in one driver, and tests, do not collide. The collector reads the
snapshot at scrape time on the server's thread: nothing is counted per record.

Names: ``absflow_task_*`` (labels job, step, subtask; ``step`` is the task's chain, named
after its head step), ``absflow_checkpoint_*`` and ``absflow_restarts_total`` (label job).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from jobmanager.web.snapshot import DURATION_BUCKETS_MS, JobBoard

__all__ = ["CONTENT_TYPE_LATEST", "exposition", "registry_for"]

_TASK_COUNTERS = (
    ("records_in", "absflow_task_records_in", "Records the task read (this attempt)."),
    ("records_out", "absflow_task_records_out", "Records the task emitted (this attempt)."),
    ("bytes_in", "absflow_task_bytes_in", "Data bytes the task received (this attempt)."),
    ("bytes_out", "absflow_task_bytes_out", "Bytes the task sent on its channels."),
    (
        "backpressure_seconds",
        "absflow_task_backpressure_seconds",
        "Time the task was blocked sending to full channels (backpressure).",
    ),
    (
        "refused_connections",
        "absflow_task_refused_connections",
        "Connections to the task's gates refused for want of the job's keys.",
    ),
    (
        "malformed_frames",
        "absflow_task_malformed_frames",
        "Frames dropped at the task's gates that were not the job's wire format.",
    ),
)
_TASK_GAUGES = (
    ("input_queue", "absflow_task_input_queue_frames", "Frames held back in the task's input."),
    ("output_queue", "absflow_task_output_queue_records", "Records waiting in output batches."),
    ("busy_share", "absflow_task_busy_ratio", "Share of time neither idle nor backpressured."),
    ("records_in_per_second", "absflow_task_records_in_per_second", "Recent input rate."),
    ("watermark", "absflow_task_watermark", "The task's event-time watermark."),
)


class SnapshotCollector(Collector):
    def __init__(self, board: JobBoard) -> None:
        self.board = board
        self.chain_name = {c["id"]: c["name"] for c in board.plan["chains"]}

    def collect(self) -> Iterator[Metric]:
        snap = self.board.latest
        if snap is None:
            return
        job = self.board.job_id
        labels = ["job", "step", "subtask"]
        for key, name, doc in _TASK_COUNTERS:
            family = CounterMetricFamily(name, doc, labels=labels)
            for t in snap.tasks:
                family.add_metric(self._labels(job, t), float(t[key]))
            yield family
        for key, name, doc in _TASK_GAUGES:
            gauge = GaugeMetricFamily(name, doc, labels=labels)
            for t in snap.tasks:
                if t[key] is not None:
                    gauge.add_metric(self._labels(job, t), float(t[key]))
            yield gauge
        yield from self._job_metrics(job, snap)

    def _labels(self, job: str, t: Any) -> list[str]:
        return [job, self.chain_name.get(t["chain"], "?"), str(t["subtask"])]

    def _job_metrics(self, job: str, snap: Any) -> Iterator[Metric]:
        buckets, cumulative = [], 0
        for bound, count in zip(
            (*DURATION_BUCKETS_MS, float("inf")), snap.duration_buckets, strict=True
        ):
            cumulative += count
            le = "+Inf" if bound == float("inf") else repr(bound / 1000)
            buckets.append((le, float(cumulative)))
        hist = HistogramMetricFamily(
            "absflow_checkpoint_duration_seconds",
            "Time from a checkpoint's trigger to its completion.",
            labels=["job"],
        )
        hist.add_metric([job], buckets, snap.duration_sum_ms / 1000)
        yield hist
        size = GaugeMetricFamily(
            "absflow_checkpoint_size_bytes",
            "State bytes of the last completed checkpoint (by kind).",
            labels=["job", "kind"],
        )
        if snap.checkpoints:
            last = snap.checkpoints[-1]
            for kind in ("state_bytes", "channel_state_bytes", "backedge_bytes"):
                size.add_metric([job, kind.removesuffix("_bytes")], float(last[kind]))
        yield size
        last_id = snap.job["last_checkpoint_id"]
        g = GaugeMetricFamily(
            "absflow_checkpoint_last_completed_id",
            "Id of the last completed checkpoint.",
            labels=["job"],
        )
        g.add_metric([job], float(last_id or 0))
        yield g
        for name, key, doc in (
            ("absflow_checkpoints_completed", "checkpoints_completed", "Completed checkpoints."),
            ("absflow_checkpoints_failed", "checkpoints_failed", "Failed checkpoints."),
            ("absflow_restarts", "restarts", "Restarts of the job."),
            (
                "absflow_refused_connections",
                "refused_connections",
                "Connections the driver (job manager, rendezvous) refused for want of the job's keys.",
            ),
        ):
            c = CounterMetricFamily(name, doc, labels=["job"])
            c.add_metric([job], float(snap.job[key]))
            yield c


def registry_for(board: JobBoard) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(board))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
