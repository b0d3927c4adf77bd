"""``/metrics``: a job's latest snapshot in the Prometheus text format, through
``prometheus_client``. Each job has its own ``CollectorRegistry`` (never the global one),
so several jobs in one driver, and tests, do not collide. The collector reads the
snapshot at scrape time on the server's thread: nothing is counted per record.

``METRICS`` is the one list of what is exported (name, type, labels, help): the collector
reads it, and the docs' metric table (docs/monitoring.md) is generated from it. Per-task
families carry the labels job, step (the task's chain, named after its head step) and
subtask; per-job families the label job.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from jobmanager.web.snapshot import DURATION_BUCKETS_MS, JobBoard, JobSnapshot, TaskRow

__all__ = ["CONTENT_TYPE_LATEST", "exposition", "registry_for"]


class MetricType(enum.Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


TASK_LABELS = ("job", "step", "subtask")


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric family. ``key`` is the task snapshot's field it reads (per-task
    families) or the job snapshot's (per-job counters); ``labels`` as exported. A counter's
    exposed sample name gets ``_total`` appended (prometheus_client's rule)."""

    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...]
    key: str = ""

    @property
    def exposed_name(self) -> str:
        return self.name + "_total" if self.type is MetricType.COUNTER else self.name


def _task(key: str, name: str, kind: MetricType, doc: str) -> MetricSpec:
    return MetricSpec(name, kind, doc, TASK_LABELS, key)


_C, _G = MetricType.COUNTER, MetricType.GAUGE
TASK_METRICS = (
    _task("records_in", "absflow_task_records_in", _C, "Records the task read (this attempt)."),
    _task(
        "records_out", "absflow_task_records_out", _C, "Records the task emitted (this attempt)."
    ),
    _task("bytes_in", "absflow_task_bytes_in", _C, "Data bytes the task received (this attempt)."),
    _task("bytes_out", "absflow_task_bytes_out", _C, "Bytes the task sent on its channels."),
    _task(
        "backpressure_seconds",
        "absflow_task_backpressure_seconds",
        _C,
        "Time the task was blocked sending to full channels (backpressure).",
    ),
    _task(
        "input_queue",
        "absflow_task_input_queue_frames",
        _G,
        "Frames held back in the task's input.",
    ),
    _task(
        "output_queue",
        "absflow_task_output_queue_records",
        _G,
        "Records waiting in output batches.",
    ),
    _task(
        "busy_share", "absflow_task_busy_ratio", _G, "Share of time neither idle nor backpressured."
    ),
    _task("records_in_per_second", "absflow_task_records_in_per_second", _G, "Recent input rate."),
    _task("watermark", "absflow_task_watermark", _G, "The task's event-time watermark."),
    _task(
        "state_keys",
        "absflow_task_state_keys",
        _G,
        "Keys in the task's keyed state at the last completed checkpoint.",
    ),
    _task(
        "state_bytes",
        "absflow_task_state_bytes",
        _G,
        "Bytes of the task's whole state at the last completed checkpoint.",
    ),
    _task(
        "refused_connections",
        "absflow_task_refused_connections",
        _C,
        "Connections to the task's gates refused for want of the job's keys.",
    ),
    _task(
        "malformed_frames",
        "absflow_task_malformed_frames",
        _C,
        "Frames dropped at the task's gates that were not the job's wire format.",
    ),
    _task(
        "aligned_pause_seconds",
        "absflow_task_aligned_pause_seconds",
        _C,
        "Time a source waited for the others (watermark alignment, max_drift).",
    ),
)
CHECKPOINT_DURATION = MetricSpec(
    "absflow_checkpoint_duration_seconds",
    MetricType.HISTOGRAM,
    "Time from a checkpoint's trigger to its completion.",
    ("job",),
)
CHECKPOINT_SIZE = MetricSpec(
    "absflow_checkpoint_size_bytes",
    _G,
    "Bytes of the last completed checkpoint, by kind: state (written for it: an incremental "
    "checkpoint's deltas), full_state (the whole state it restores from), channel_state, "
    "backedge.",
    ("job", "kind"),
)
LAST_COMPLETED = MetricSpec(
    "absflow_checkpoint_last_completed_id", _G, "Id of the last completed checkpoint.", ("job",)
)
JOB_COUNTERS = (
    MetricSpec(
        "absflow_checkpoints_completed",
        _C,
        "Completed checkpoints.",
        ("job",),
        "checkpoints_completed",
    ),
    MetricSpec(
        "absflow_checkpoints_failed", _C, "Failed checkpoints.", ("job",), "checkpoints_failed"
    ),
    MetricSpec("absflow_restarts", _C, "Restarts of the job.", ("job",), "restarts"),
    MetricSpec(
        "absflow_refused_connections",
        _C,
        "Connections the driver (job manager, rendezvous) refused for want of the job's keys.",
        ("job",),
        "refused_connections",
    ),
)
ITERATION_METRICS = (
    MetricSpec(
        "absflow_superstep",
        _G,
        "An iteration's superstep running (or last started).",
        ("job", "phase"),
        "superstep",
    ),
    MetricSpec(
        "absflow_supersteps_done",
        _G,
        "An iteration's supersteps agreed by every loop head.",
        ("job",),
        "supersteps_done",
    ),
    MetricSpec(
        "absflow_superstep_aggregate",
        _G,
        "An iteration's convergence aggregate of its last superstep (delta: changed keys).",
        ("job",),
        "aggregate",
    ),
    MetricSpec(
        "absflow_supersteps_started",
        _C,
        "Supersteps started over all attempts (re-runs after recoveries included).",
        ("job",),
        "supersteps_started",
    ),
)
METRICS: tuple[MetricSpec, ...] = (
    *TASK_METRICS,
    CHECKPOINT_DURATION,
    CHECKPOINT_SIZE,
    LAST_COMPLETED,
    *JOB_COUNTERS,
    *ITERATION_METRICS,
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
        for spec in TASK_METRICS:
            family_type = (
                CounterMetricFamily if spec.type is MetricType.COUNTER else GaugeMetricFamily
            )
            family = family_type(spec.name, spec.help, labels=list(spec.labels))
            for t in snap.tasks:
                if t.get(spec.key) is not None:  # None: not there yet (a watermark)
                    family.add_metric(self._labels(job, t), _figure(t, spec.key))
            yield family
        yield from self._job_metrics(job, snap)

    def _labels(self, job: str, t: TaskRow) -> list[str]:
        return [job, self.chain_name.get(t["chain"], "?"), str(t["subtask"])]

    def _job_metrics(self, job: str, snap: JobSnapshot) -> Iterator[Metric]:
        buckets, cumulative = [], 0
        for bound, count in zip(
            (*DURATION_BUCKETS_MS, float("inf")), snap.duration_buckets, strict=True
        ):
            cumulative += count
            le = "+Inf" if bound == float("inf") else repr(bound / 1000)
            buckets.append((le, float(cumulative)))
        hist = HistogramMetricFamily(
            CHECKPOINT_DURATION.name,
            CHECKPOINT_DURATION.help,
            labels=list(CHECKPOINT_DURATION.labels),
        )
        hist.add_metric([job], buckets, snap.duration_sum_ms / 1000)
        yield hist
        size = GaugeMetricFamily(
            CHECKPOINT_SIZE.name, CHECKPOINT_SIZE.help, labels=list(CHECKPOINT_SIZE.labels)
        )
        if snap.checkpoints:
            last = snap.checkpoints[-1]
            for kind in (
                "state_bytes",
                "full_state_bytes",
                "channel_state_bytes",
                "backedge_bytes",
            ):
                size.add_metric([job, kind.removesuffix("_bytes")], float(last[kind]))
        yield size
        last_id = snap.job["last_checkpoint_id"]
        g = GaugeMetricFamily(
            LAST_COMPLETED.name, LAST_COMPLETED.help, labels=list(LAST_COMPLETED.labels)
        )
        g.add_metric([job], float(last_id or 0))
        yield g
        for spec in JOB_COUNTERS:
            c = CounterMetricFamily(spec.name, spec.help, labels=list(spec.labels))
            c.add_metric([job], _figure(snap.job, spec.key))
            yield c
        if snap.iteration is not None:
            yield from self._iteration_metrics(job, snap.iteration)

    @staticmethod
    def _iteration_metrics(job: str, it: Mapping[str, object]) -> Iterator[Metric]:
        for spec in ITERATION_METRICS:
            family_type = (
                CounterMetricFamily if spec.type is MetricType.COUNTER else GaugeMetricFamily
            )
            family = family_type(spec.name, spec.help, labels=list(spec.labels))
            if it[spec.key] is not None:
                labels = [job, str(it["phase"])] if "phase" in spec.labels else [job]
                family.add_metric(labels, _figure(it, spec.key))
            yield family


def _figure(row: Mapping[str, object], key: str) -> float:
    """The number ``row[key]`` (a figure named by a metric spec) as a float."""
    value = row[key]
    if not isinstance(value, int | float):
        raise TypeError(f"figure {key!r} of a snapshot row is {value!r}, not a number")
    return float(value)


def registry_for(board: JobBoard) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(board))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
