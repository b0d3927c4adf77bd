"""The one schema of the figures tasks report and the job manager keeps.

Tasks write them (heartbeats and ``Finished``: `TaskMetrics`; checkpoint acks:
`AckMetrics`), the coordinator sums a checkpoint's acks (`CheckpointSummary`, kept with
the per-task figures in the checkpoint's ``_metadata``), and the readers — ``python -m
jobmanager checkpoints``, the REST API, ``/metrics`` and the dashboard — read the same
records. Every record is a frozen dataclass; `encode` turns one into a JSON/msgpack map
and `decode` back. ``decode`` is lenient on purpose: a field the map lacks (metadata of an
older absflow) takes its default, a key the schema does not know (a newer peer) is kept in
``extra`` and written back by ``encode``. Tasks and the driver both import this module;
it imports nothing of ``runtime`` or ``jobmanager``.

Counters are cumulative since the task's attempt started and updated per batch, never per
record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

R = TypeVar("R", bound="MetricsRecord")


@dataclass(frozen=True, slots=True)
class MetricsRecord:
    """Base of the schema's records (see `encode`/`decode`)."""

    extra: Mapping[str, Any] = field(default_factory=dict, kw_only=True)
    """Keys this version does not know (kept, written back)."""

    def encode(self) -> dict[str, Any]:
        return encode(self)

    @classmethod
    def decode(cls: type[R], data: Mapping[str, Any] | None) -> R:
        """The module's `decode` of ``data`` as this record."""
        return decode(cls, data)


@dataclass(frozen=True, slots=True)
class TaskMetrics(MetricsRecord):
    """A task's figures since its attempt started: sent with every heartbeat and with
    ``Finished``. Shares are of ``uptime_seconds``."""

    records_in: int = 0
    records_out: int = 0
    bytes_in: int = 0  # data frames received, as on the wire
    bytes_out: int = 0  # frames sent on the output channels, headers included
    backpressure_seconds: float = 0.0  # blocked on full output channels
    idle_seconds: float = 0.0  # waiting for input
    uptime_seconds: float = 0.0  # since the task opened
    input_queue: int = 0  # frames held back in the task (blocked channels, feedback)
    output_queue: int = 0  # records written to output batches and not yet sent
    rss_bytes: int = 0
    peak_rss: int = 0
    spilled_bytes: int = 0
    first_record_at: float = 0.0  # wall clock; 0 until the first record
    watermark: float | None = None  # the task's event-time watermark, once there is one
    watermark_idle: bool = False  # a source whose assigner marked it idle
    aligned_pause_seconds: float = 0.0  # a source paused by watermark alignment (max_drift)
    refused_connections: int = 0  # to its gates, for want of the job's keys (secure_channels)
    malformed_frames: int = 0  # dropped at its gates: not frames of the job's wire format

    @property
    def backpressure_share(self) -> float:
        return _share(self.backpressure_seconds, self.uptime_seconds)

    @property
    def busy_share(self) -> float:
        """Time neither waiting for input nor blocked on sends."""
        if self.uptime_seconds <= 0:
            return 0.0
        return max(
            0.0, 1.0 - self.backpressure_share - _share(self.idle_seconds, self.uptime_seconds)
        )


@dataclass(frozen=True, slots=True)
class AckMetrics(MetricsRecord):
    """A task's part of one checkpoint (sent with its ack)."""

    start_delay_ms: float = 0.0  # trigger to the first barrier at this task
    alignment_ms: float = 0.0  # first to last barrier
    sync_ms: float = 0.0  # capturing the state (the task stops for this)
    async_ms: float = 0.0  # writing the state file (the task goes on meanwhile)
    keys: int = 0
    state_bytes: int = 0  # written for this checkpoint (an incremental one: its deltas)
    full_state_bytes: int = 0  # the whole state it restores from (base and deltas)
    spilled_bytes: int = 0
    records_in: int = 0  # counts at the snapshot, since the attempt started
    records_out: int = 0
    channel_state_records: int = 0  # in-flight records logged (unaligned modes)
    channel_state_bytes: int = 0
    backedge_records: int = 0  # records logged on loop back-edges
    backedge_bytes: int = 0
    drained_sent: int | None = None  # synchronous mode: counts when the drain was proven
    drained_received: int | None = None
    watermark: float | None = None  # the task's event-time watermark at the snapshot (finite)


@dataclass(frozen=True, slots=True)
class CheckpointSummary(MetricsRecord):
    """A completed checkpoint over its tasks (`summarize` of the acks)."""

    tasks: int = 0
    mode: str = ""
    duration_ms: float = 0.0
    max_start_delay_ms: float = 0.0
    max_alignment_ms: float = 0.0
    mean_alignment_ms: float = 0.0
    max_sync_ms: float = 0.0
    max_async_ms: float = 0.0
    state_bytes: int = 0  # written for this checkpoint
    full_state_bytes: int = 0  # the state it restores from (incremental: chains included)
    spilled_bytes: int = 0
    keys: int = 0
    backedge_records: int = 0
    backedge_bytes: int = 0
    channel_state_records: int = 0
    channel_state_bytes: int = 0
    halt_ms: float | None = None  # synchronous mode: halt to completion
    drain_ms: float | None = None  # synchronous mode: halt until nothing was in flight
    # What the checkpoint waited for, at the task that finished last (`critical_split`):
    critical_task: str = ""
    queueing_ms: float = 0.0  # trigger to its first barrier: barriers behind records
    alignment_ms: float = 0.0  # its first to its last barrier: a slower input channel
    write_ms: float = 0.0  # capturing and writing its state


def summarize(
    per_task: Mapping[str, AckMetrics], mode: str, duration_ms: float
) -> CheckpointSummary:
    """Checkpoint-level figures from the tasks' ack metrics."""
    acks = list(per_task.values())

    def mx(values: list[float]) -> float:
        return round(max(values, default=0.0), 3)

    alignments = [a.alignment_ms for a in acks]
    critical, queueing, alignment, write = critical_split(per_task)
    return CheckpointSummary(
        tasks=len(acks),
        mode=mode,
        duration_ms=round(duration_ms, 3),
        max_start_delay_ms=mx([a.start_delay_ms for a in acks]),
        max_alignment_ms=mx(alignments),
        mean_alignment_ms=round(sum(alignments) / max(1, len(alignments)), 3),
        max_sync_ms=mx([a.sync_ms for a in acks]),
        max_async_ms=mx([a.async_ms for a in acks]),
        state_bytes=sum(a.state_bytes for a in acks),
        full_state_bytes=sum(a.full_state_bytes or a.state_bytes for a in acks),
        spilled_bytes=sum(a.spilled_bytes for a in acks),
        keys=sum(a.keys for a in acks),
        backedge_records=sum(a.backedge_records for a in acks),
        backedge_bytes=sum(a.backedge_bytes for a in acks),
        channel_state_records=sum(a.channel_state_records for a in acks),
        channel_state_bytes=sum(a.channel_state_bytes for a in acks),
        critical_task=critical,
        queueing_ms=queueing,
        alignment_ms=alignment,
        write_ms=write,
    )


def critical_split(per_task: Mapping[str, AckMetrics]) -> tuple[str, float, float, float]:
    """What a checkpoint waited for: ``(task, queueing, alignment, write)`` in ms at the
    task whose state was written last (the one the checkpoint's completion waited for).

    Its time since the trigger splits into three parts that add up: *queueing*, until its
    first barrier arrived (the barriers travelling behind the records queued at every hop
    upstream, and the upstream tasks' own snapshots); *alignment*, from its first to its
    last barrier (one input channel slower than the others); *write*, capturing and writing
    its state. Large queueing means too much data in flight (see ``max_inflight_time``),
    large alignment a skewed or slow input, large write a big state or slow storage."""
    best: tuple[str, float, float, float] = ("", 0.0, 0.0, 0.0)
    latest = -1.0
    for task, a in sorted(per_task.items()):
        done = a.start_delay_ms + a.alignment_ms + a.sync_ms + a.async_ms
        if done > latest:
            latest = done
            best = (
                task,
                round(a.start_delay_ms, 3),
                round(a.alignment_ms, 3),
                round(a.sync_ms + a.async_ms, 3),
            )
    return best


def encode(record: MetricsRecord) -> dict[str, Any]:
    """``record`` as a map of plain values (its unknown ``extra`` keys included)."""
    out: dict[str, Any] = dict(record.extra)
    for name, _kind, _default in _schema(type(record)):
        out[name] = getattr(record, name)
    return out


def decode(cls: type[R], data: Mapping[str, Any] | None) -> R:
    """A ``cls`` from ``data`` (see the module docstring: missing fields take their
    defaults, unknown keys go to ``extra``). Raises ValueError naming the field when a
    value has the wrong type."""
    data = data or {}
    kwargs: dict[str, Any] = {}
    schema = _schema(cls)
    for name, kind, default in schema:
        if name in data:
            value = data[name]
            # The common case, a value of the field's own type, needs no conversion.
            kwargs[name] = (
                value if type(value) is kind else _coerce(cls, name, kind, default, value)
            )
    extra = {k: v for k, v in data.items() if k not in kwargs} if len(kwargs) < len(data) else {}
    return cls(**kwargs, extra=extra)


_SCHEMAS: dict[type, tuple[tuple[str, type, Any], ...]] = {}


def _schema(cls: type[MetricsRecord]) -> tuple[tuple[str, type, Any], ...]:
    """``(name, type, default)`` of each field but ``extra``, computed once per class
    (``dataclasses.fields`` per call cost more than the rest of a decode: the job manager
    decodes a dozen acks per checkpoint and every heartbeat). An optional figure (default
    None) takes the type its annotation names."""
    schema = _SCHEMAS.get(cls)
    if schema is None:
        fields = []
        for f in dataclasses.fields(cls):
            if f.name == "extra":
                continue
            if f.default is None:
                kind: type = int if str(f.type).startswith("int") else float
            else:
                kind = type(f.default)
            fields.append((f.name, kind, f.default))
        schema = _SCHEMAS[cls] = tuple(fields)
    return schema


def _coerce(cls: type, name: str, kind: type, default: Any, value: Any) -> Any:
    if value is None:
        return None if default is None else default
    try:
        if kind is bool:
            return bool(value)
        if kind in (int, float):
            return kind(value)
        return str(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{cls.__name__}.{name}: {value!r} is not a {kind.__name__}") from err


def _share(part: float, whole: float) -> float:
    return min(1.0, part / whole) if whole > 0 else 0.0
