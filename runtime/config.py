"""Run settings of a job (checkpointing, channels, restarts, progress display)."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

from channels.security import ChannelKeys
from runtime.errors import GraphError
from runtime.scheduling import TASK_SCHEDULING
from statebackend.metadata import CheckpointMetadata
from statebackend.storage import CheckpointStorage

# How the job manager starts the tasks (``jobmanager.launchers``): a Spark barrier stage
# per attempt (the product), or local processes without Spark (the test harness).
LAUNCHERS = ("spark", "local")


class SnapshotMode(enum.Enum):
    EXACTLY_ONCE = "exactly_once"  # aligned ABS: block channels until all barriers arrived
    AT_LEAST_ONCE = "at_least_once"  # barriers counted, nothing blocked (replay may duplicate)
    UNALIGNED = "unaligned"  # Chandy-Lamport: snapshot at the first barrier, log channel state
    SYNCHRONOUS = "synchronous"  # Naiad's (the paper's baseline): halt all, drain, snapshot, resume


@dataclass(frozen=True)
class JobConfig:
    """Settings of one run; pass them to ``Dataflow(...)`` or ``run(...)`` as keywords.

    Checkpointing is on when ``checkpoint_interval`` (seconds) is set. Without a
    ``checkpoint_dir`` a temporary directory is used and removed after the run.
    ``checkpoint_dir`` (and ``run(restore_from=...)``) is a path, a ``file://`` URL, or
    an fsspec URL (``s3://bucket/prefix``, ``hdfs://namenode:8020/path``) opened with
    ``storage_options`` (endpoint, credentials, ...: passed to fsspec as keywords, on the
    driver and in every task; kept out of ``repr``, since they may hold secrets).
    ``launcher``: ``"spark"`` (the default) runs every attempt as a Spark barrier stage;
    ``"local"`` runs the tasks as local processes without Spark (``runtime.testing``).
    ``allow_non_restored_state``: ``run(restore_from=...)`` drops (with a warning) the
    state of checkpointed steps the job no longer has, instead of refusing the checkpoint.
    """

    checkpoint_interval: float | None = None
    checkpoint_dir: str | None = None
    checkpoint_timeout: float = 60.0
    min_pause_between_checkpoints: float = 0.0
    max_concurrent_checkpoints: int = 1
    tolerable_checkpoint_failures: int = 3
    retained_checkpoints: int = 3
    # A task state of at most this many bytes goes inline in the ack and _metadata, not
    # into a state file of its own (Flink's state.storage.fs.memory-threshold); 0: files.
    state_inline_threshold: int = 20 * 1024
    # lz4 every section of a task's state file (Flink's execution.checkpointing.
    # snapshot-compression, off there too): smaller files for an object store, for CPU in
    # the writer thread that local disk does not repay (statebackend.snapshot).
    snapshot_compression: bool = False
    snapshot_mode: SnapshotMode | str = SnapshotMode.EXACTLY_ONCE
    aligned_timeout: float | None = None  # exactly_once: turn unaligned when aligning longer
    restart_strategy: Any = (
        None  # jobmanager.restart strategy; default: exponential if checkpointing
    )
    batch_size: int = 1000
    buffer_timeout: float = 0.01
    channel_hwm: int = 8  # batches queued per channel side (their size: max_inflight_time)
    # Bounded in-flight data (Flink's buffer debloating): batches sized so that what a
    # channel can queue drains within this many seconds at its measured throughput
    # (None: fixed batches of batch_size); the kernel's share: socket buffers of
    # socket_buffer bytes (0: the OS's autotuned ones, megabytes on loopback).
    max_inflight_time: float | None = 0.015
    socket_buffer: int = 64 * 1024
    # Tasks on one host (same kernel and network namespace) exchange data over Unix
    # sockets (send buffers of socket_buffer bytes): no TCP acknowledgements and
    # retransmission timers in a channel's way; tasks on other hosts over TCP.
    local_channels: bool = True
    # "batch": task processes run under Linux's SCHED_BATCH (a task woken by input waits
    # for the running one's slice instead of preempting it mid-batch: throughput on
    # shared cores; runtime.scheduling); "normal": the OS's default policy.
    task_scheduling: str = "batch"
    # Task processes: Python's young-generation GC threshold (threshold0; Python's own is
    # 700, which collects mid-batch and promotes records in flight), with what the task
    # built before its first record frozen out of collections (runtime.task_gc); None:
    # Python's settings.
    gc_threshold: int | None = 50_000
    spill_threshold: int = 32 * 1024 * 1024
    compress_min_bytes: int = 64 * 1024
    heartbeat_interval: float = 0.5
    heartbeat_timeout: float = 15.0
    progress: bool | None = None  # None: only when stderr is a terminal
    ui: bool = True  # the web dashboard, REST API and /metrics (jobmanager.web)
    ui_host: str = "127.0.0.1"  # "0.0.0.0" exposes the (read-only) dashboard to the network
    ui_port: int = 8081  # taken: another free port is used (and printed); 0: any free port
    local_master: str | None = None  # embedded SparkSession master (default local[n])
    executor_wait: float = 60.0  # on a cluster: how long to wait for executors to register
    timeout: float | None = None  # give up (cancel) after this many seconds
    allow_non_restored_state: bool = False  # restore_from may drop state of removed steps
    debug_drop_in_flight_log: bool = False  # tests only: restore loops without their back-edge log
    debug_drop_event_time: bool = False  # tests only: restore without timers and watermarks
    debug_skip_drain: bool = False  # tests only: synchronous snapshots without waiting to drain
    storage_options: dict[str, Any] = field(default_factory=dict, repr=False, hash=False)
    launcher: str | None = None  # "spark" | "local"; None: $ABSFLOW_LAUNCHER, else spark
    secure_channels: bool | None = field(
        default=None,
        metadata={
            "help": "CURVE (authenticated, encrypted ZeroMQ) on every connection between "
            "the job manager, the rendezvous and the tasks, with keys made per run, and "
            "strangers refused and counted; None: on when the Spark master is not local "
            "(off for local[n], local-cluster and the local launcher), True/False: force it."
        },
    )

    def __post_init__(self) -> None:
        if self.launcher is not None and self.launcher not in LAUNCHERS:
            raise GraphError(
                f"launcher {self.launcher!r} is unknown; use one of {', '.join(LAUNCHERS)} "
                "('local' runs the tasks as local processes without Spark, for tests)."
            )
        if self.task_scheduling not in TASK_SCHEDULING:
            raise GraphError(
                f"task_scheduling {self.task_scheduling!r} is unknown; use 'batch' (SCHED_BATCH "
                "on Linux: throughput) or 'normal' (the OS's default policy)."
            )
        if self.gc_threshold is not None and not (
            isinstance(self.gc_threshold, int)
            and not isinstance(self.gc_threshold, bool)
            and self.gc_threshold >= 1
        ):
            raise GraphError(
                f"gc_threshold must be a whole number of allocations >= 1 (Python's default "
                f"is 700), or None to leave Python's collector alone; got {self.gc_threshold!r}."
            )
        if isinstance(self.snapshot_mode, str):
            try:
                object.__setattr__(self, "snapshot_mode", SnapshotMode(self.snapshot_mode))
            except ValueError:
                modes = ", ".join(m.value for m in SnapshotMode)
                raise GraphError(
                    f"snapshot_mode {self.snapshot_mode!r} is unknown; use one of {modes}."
                ) from None
        if self.aligned_timeout is not None:
            if not isinstance(self.aligned_timeout, int | float) or self.aligned_timeout < 0:
                raise GraphError(
                    f"aligned_timeout must be >= 0 seconds (or None), got {self.aligned_timeout!r}."
                )
            if self.snapshot_mode not in (SnapshotMode.EXACTLY_ONCE, SnapshotMode.UNALIGNED):
                raise GraphError(
                    f"aligned_timeout applies to aligned exactly-once checkpoints; snapshot_mode "
                    f"{SnapshotMode(self.snapshot_mode).value!r} has no alignment: drop aligned_timeout."
                )
        if self.max_inflight_time is not None and not (
            isinstance(self.max_inflight_time, int | float) and self.max_inflight_time > 0
        ):
            raise GraphError(
                f"max_inflight_time must be > 0 seconds (or None for fixed batches), "
                f"got {self.max_inflight_time!r}."
            )
        if self.checkpoint_interval is not None and not self.checkpoint_interval > 0:
            raise GraphError(
                f"checkpoint_interval must be > 0 seconds (or None for off), got {self.checkpoint_interval!r}."
            )
        options = self.storage_options
        if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
            raise GraphError(
                f"storage_options must be a dict of fsspec keyword arguments with str keys "
                f"(e.g. {{'endpoint_url': 'http://host:9000'}}), got {type(options).__name__}."
            )
        _check_counts(self)
        _check_switches(self)
        if not isinstance(self.ui_port, int) or not 0 <= self.ui_port <= 65535:
            raise GraphError(f"ui_port must be a TCP port 0..65535 (0: any), got {self.ui_port!r}.")
        if not isinstance(self.ui_host, str) or not self.ui_host:
            raise GraphError(f"ui_host must be a host name or address, got {self.ui_host!r}.")

    @property
    def records_channel_state(self) -> bool:
        """Unaligned checkpoints, or aligned ones that may turn unaligned."""
        return self.snapshot_mode is SnapshotMode.UNALIGNED or self.aligned_timeout is not None

    @property
    def barriers_overtake(self) -> bool:
        """Unaligned checkpoints (no alignment at all): barriers also travel a priority
        path that overtakes queued records, and tasks snapshot when the first arrives."""
        return self.records_channel_state and not self.aligned_timeout

    def secures_channels(self, remote: bool) -> bool:
        """Whether a run uses CURVE: ``secure_channels`` if set, else whether its tasks may
        run on other hosts (``remote``: a Spark master that is not local)."""
        return self.secure_channels if self.secure_channels is not None else remote

    @property
    def checkpointing(self) -> bool:
        return self.checkpoint_interval is not None

    def replace(self, **changes: Any) -> JobConfig:
        names = {f.name for f in dataclasses.fields(self)}
        unknown = set(changes) - names
        if unknown:
            raise GraphError(f"unknown setting(s) {sorted(unknown)}; known: {sorted(names)}.")
        return dataclasses.replace(self, **changes)


def _check_switches(config: JobConfig) -> None:
    """The settings that are on/off switches."""
    if not isinstance(config.snapshot_compression, bool):
        raise GraphError(
            f"snapshot_compression must be True (lz4 state files) or False, "
            f"got {config.snapshot_compression!r}."
        )
    if config.secure_channels not in (None, True, False):
        raise GraphError(
            f"secure_channels must be True, False or None (on for a cluster master), "
            f"got {config.secure_channels!r}."
        )


def _check_counts(config: JobConfig) -> None:
    """The settings that are whole numbers: counts (>= 1) and byte sizes (>= 0)."""
    for name in (
        "batch_size",
        "channel_hwm",
        "max_concurrent_checkpoints",
        "retained_checkpoints",
    ):
        value = getattr(config, name)
        if not isinstance(value, int) or value < 1:
            raise GraphError(f"{name} must be an int >= 1, got {value!r}.")
    for name, zero in (
        ("socket_buffer", "0 for the OS default"),
        ("state_inline_threshold", "0 writes every task state to a file"),
    ):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise GraphError(f"{name} must be an int >= 0 (bytes; {zero}), got {value!r}.")


@dataclass(frozen=True)
class TaskFault:
    """A fault a task injects into itself (a real SIGKILL of its own process, or a raise)."""

    kind: str  # "kill_during_alignment" | "kill_during_snapshot" | "raise_at_record"
    task_index: int
    attempt: int = 0
    checkpoint_id: int | None = None  # first checkpoint at or after which to fire
    operator: str | None = None
    record: int | None = None


@dataclass(frozen=True)
class TaskEnvironment:
    """What the job manager hands every task of one attempt (pickled to the executors).

    The roots are paths or URLs; ``config.storage_options`` (endpoint, credentials) go
    with them, so that every task opens the same storage the driver opened."""

    jm_endpoint: str
    attempt: int
    config: JobConfig
    checkpoint_root: str | None  # CheckpointStorage root (path or URL) for state; None: none
    restore_root: str | None  # CheckpointStorage root holding the checkpoint to restore
    restore_metadata: CheckpointMetadata | None  # that checkpoint's (verified) metadata
    run_id: str = "run"  # names the tasks' temp dirs (stale ones of a run are removed)
    faults: tuple[TaskFault, ...] = ()
    # The run's CURVE keys (secure_channels), or None: plain ZeroMQ. They reach the tasks
    # only inside what launches them (the barrier stage's closure, the local task's stdin).
    channel_keys: ChannelKeys | None = field(default=None, repr=False)

    def open_storage(self, root: str) -> CheckpointStorage:
        """The checkpoint storage at ``root`` (one of the roots above), opened with the
        driver's ``storage_options`` (no I/O)."""
        return CheckpointStorage(
            root,
            storage_options=self.config.storage_options,
            inline_threshold=self.config.state_inline_threshold,
            compression=self.config.snapshot_compression,
        )
