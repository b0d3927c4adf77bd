"""Run settings of a job (checkpointing, channels, restarts, progress display)."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

from runtime.errors import GraphError
from runtime.scheduling import TASK_SCHEDULING

# How the job manager starts the tasks (``jobmanager.launchers``): a Spark barrier stage
# per attempt (the product), or local processes without Spark (the test harness).
LAUNCHERS = ("spark", "local")
STATE_BACKENDS = ("memory", "rocksdb")


class SuperstepCheckpointStyle(enum.Enum):
    """When an iteration's superstep checkpoint is written (seed 004, formulas 10-12)."""

    BLOCKING = "blocking"  # at the boundary; the next superstep waits for its completion
    TAIL = "tail"  # each head snapshots as its own update ends, before the boundary agreement
    HEAD = "head"  # at the boundary; written while the next superstep's messages flow


class SnapshotMode(enum.Enum):
    EXACTLY_ONCE = "exactly_once"  # aligned ABS: block channels until all barriers arrived
    AT_LEAST_ONCE = "at_least_once"  # barriers counted, nothing blocked (replay may duplicate)
    UNALIGNED = "unaligned"  # Chandy-Lamport: snapshot at the first barrier, log channel state
    SYNCHRONOUS = "synchronous"  # Naiad's (the paper's baseline): halt all, drain, snapshot, resume


@dataclass(frozen=True)
class OptimisticRecovery:
    """An iteration's optimistic recovery (seed 004; ``jobmanager.optimistic``): when a
    task fails, the surviving loop heads' state is written as a rescue snapshot (waiting
    up to ``rescue_timeout`` seconds for it), the next attempt restores it and rebuilds
    the lost keys with ``compensation(surviving solution, lost keys, the lost keys' side
    input)`` (a delta iteration's returns ``(values, workset additions)``), and goes on
    with the superstep that failed. With more than ``max_lost_fraction`` of the loop
    heads lost, or when the rescue fails, the run falls back to its newest checkpoint
    (``superstep_checkpoint_interval`` makes some), else to the start, and says so."""

    compensation: Any
    max_lost_fraction: float = 0.5
    rescue_timeout: float = 2.0

    def __post_init__(self) -> None:
        if not callable(self.compensation):
            raise GraphError(
                f"optimistic recovery needs a compensation function, got "
                f"{self.compensation!r}; e.g. runtime.iterations.library.pagerank_compensation"
            )
        if not 0.0 <= self.max_lost_fraction <= 1.0:
            raise GraphError(
                f"max_lost_fraction must be between 0 and 1, got {self.max_lost_fraction!r}"
            )
        if not self.rescue_timeout > 0:
            raise GraphError(f"rescue_timeout must be > 0 seconds, got {self.rescue_timeout!r}")


def _check_optimistic(value: object) -> None:
    if value is not None and not isinstance(value, OptimisticRecovery):
        raise GraphError(
            f"optimistic_recovery must be a runtime.config.OptimisticRecovery (or None), "
            f"got {value!r}"
        )


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
    ``"local"`` runs the tasks as local processes without Spark (``runtime.api.testing``).
    ``allow_non_restored_state``: ``run(restore_from=...)`` drops (with a warning) the
    state of checkpointed steps the job no longer has, instead of refusing the checkpoint.
    """

    checkpoint_interval: float | None = field(
        default=None,
        metadata={"help": "Seconds between checkpoint triggers; None turns checkpointing off."},
    )
    superstep_checkpoint_interval: int | None = field(
        default=None,
        metadata={
            "help": "Iterations: a checkpoint at the boundary after every k-th superstep "
            "(a restart goes on from the latest); None: none (a restart starts over)."
        },
    )
    optimistic_recovery: OptimisticRecovery | None = field(
        default=None,
        metadata={
            "help": "Iterations: recover a failed task optimistically (rescue the "
            "survivors' state, compensate the lost keys; runtime.config.OptimisticRecovery); "
            "None: restart from the newest checkpoint or the start."
        },
    )
    superstep_checkpoint_style: SuperstepCheckpointStyle | str = field(
        default=SuperstepCheckpointStyle.BLOCKING,
        metadata={
            "help": "Iterations: 'blocking' (the next superstep starts once the checkpoint "
            "completed), 'tail' (each loop head snapshots as its own update ends, before the "
            "boundary agreement; the next superstep waits for completion) or 'head' (the next "
            "superstep starts once every head took its snapshot; the write overlaps it)."
        },
    )
    checkpoint_dir: str | None = field(
        default=None,
        metadata={
            "help": "Where checkpoints are written: a path, a file:// URL or an fsspec URL "
            "(s3://, hdfs://); None: a temp dir removed after the run (local masters only)."
        },
    )
    checkpoint_timeout: float = field(
        default=60.0,
        metadata={"help": "Seconds after which a checkpoint that has not completed expires."},
    )
    min_pause_between_checkpoints: float = field(
        default=0.0,
        metadata={"help": "Seconds from the last completed checkpoint to the next trigger."},
    )
    max_concurrent_checkpoints: int = field(
        default=1, metadata={"help": "Checkpoints that may be in flight at once."}
    )
    tolerable_checkpoint_failures: int = field(
        default=3,
        metadata={"help": "Consecutive failed checkpoints before the attempt fails."},
    )
    retained_checkpoints: int = field(
        default=3, metadata={"help": "Completed checkpoints kept; older ones are deleted."}
    )
    state_inline_threshold: int = field(
        default=20 * 1024,
        metadata={
            "help": "Bytes: a task state this small goes inline in the ack and _metadata, not "
            "into a state file of its own (Flink's state.storage.fs.memory-threshold); 0: "
            "always a file."
        },
    )
    snapshot_compression: bool = field(
        default=False,
        metadata={
            "help": "lz4 every section of a task's state file (Flink's snapshot-compression, "
            "off there too): about half the bytes, for about three times the writer thread's "
            "CPU; restores read either form."
        },
    )
    incremental_checkpoints: bool = field(
        default=True,
        metadata={
            "help": "Checkpoint large keyed state incrementally: a base, then per checkpoint "
            "only the keys changed since the last one, chained (statebackend.incremental); "
            "savepoints stay whole (the final checkpoint at the end of the input is "
            "incremental like any other). False: every checkpoint whole."
        },
    )
    incremental_min_keys: int = field(
        default=10_000,
        metadata={
            "help": "An operator's keyed state starts a chain of incremental checkpoints once "
            "its largest state holds this many keys; smaller states are written whole "
            "(cheap, and inline in the ack when tiny)."
        },
    )
    incremental_max_chain: int = field(
        default=32,
        metadata={
            "help": "Deltas in a chain before a background compaction merges the newest "
            "files of like size (with the base once they hold as many keys): bounds the "
            "files a restore reads. A chain holding twice the live keys is compacted "
            "sooner (runtime.changelog)."
        },
    )
    debug_drop_deltas: bool = field(
        default=False,
        metadata={
            "help": "Tests only: incremental checkpoints write empty deltas (rocksdb: a "
            "checkpoint lists only the files it uploaded)."
        },
    )
    state_backend: str = field(
        default="memory",
        metadata={
            "help": "Where keyed state lives: 'memory' (Python dicts, the fastest while it "
            "fits) or 'rocksdb' (an embedded RocksDB on the task's local disk with a bounded "
            "cache of hot keys: state larger than memory; checkpoints upload only new SST "
            "files; needs the rocksdict package). Savepoints restore on either."
        },
    )
    state_memory_budget_mb: float | None = field(
        default=None,
        metadata={
            "help": "Memory (MiB) the keyed state of one task may take. The memory backend "
            "fails the job with an error naming the step when an estimate passes it; the "
            "rocksdb backend sizes its caches and write buffers within it (256 MiB when "
            "unset). None: no limit on the memory backend."
        },
    )
    snapshot_mode: SnapshotMode | str = field(
        default=SnapshotMode.EXACTLY_ONCE,
        metadata={
            "help": "exactly_once (aligned ABS), unaligned (Chandy-Lamport), at_least_once "
            "(barriers counted, nothing blocked) or synchronous (the paper's Naiad baseline)."
        },
    )
    aligned_timeout: float | None = field(
        default=None,
        metadata={
            "help": "Seconds an aligned checkpoint may align before it turns unaligned and "
            "logs the slow inputs' records as channel state; None: never."
        },
    )
    restart_strategy: Any = field(
        default=None,
        metadata={
            "help": "A jobmanager.restart strategy; None: ExponentialBackoff() with "
            "checkpointing, NoRestart() without."
        },
    )
    batch_size: int = field(
        default=1000,
        metadata={"help": "Records per network batch (the upper bound when batches are sized)."},
    )
    buffer_timeout: float = field(
        default=0.01, metadata={"help": "Seconds the longest a partial batch waits to be sent."}
    )
    channel_hwm: int = field(
        default=8,
        metadata={
            "help": "Batches queued per channel side before backpressure applies; their size "
            "comes from max_inflight_time."
        },
    )
    max_inflight_time: float | None = field(
        default=0.015,
        metadata={
            "help": "Bounded in-flight data (Flink's buffer debloating): each channel sizes its "
            "batches so that what it can queue drains within this many seconds at the "
            "receiver's measured rate; None: fixed batches of batch_size."
        },
    )
    socket_buffer: int = field(
        default=64 * 1024,
        metadata={
            "help": "Bytes of the kernel's send and receive buffers per data connection, which "
            "bound what waits ahead of a barrier there; 0: the OS's autotuned ones "
            "(megabytes on loopback)."
        },
    )
    local_channels: bool = field(
        default=True,
        metadata={
            "help": "Tasks on one host exchange data over Unix sockets (no TCP acknowledgements "
            "or retransmission timers in a channel's way), tasks on other hosts over TCP; "
            "False: TCP everywhere."
        },
    )
    task_scheduling: str = field(
        default="batch",
        metadata={
            "help": "batch: task processes run under Linux's SCHED_BATCH (a task woken by input "
            "does not preempt the running one mid-batch); normal: the OS's default policy."
        },
    )
    gc_threshold: int | None = field(
        default=50_000,
        metadata={
            "help": "Task processes: Python's young-generation GC threshold (Python's own is "
            "700, which collects mid-batch), with what the task built before its first record "
            "frozen out of collections; None: Python's settings."
        },
    )
    spill_threshold: int = field(
        default=32 * 1024 * 1024,
        metadata={
            "help": "Bytes a blocked channel's buffer, a loop's feedback queue or a back-edge "
            "log holds in memory before it spills to local disk."
        },
    )
    compress_min_bytes: int = field(
        default=64 * 1024,
        metadata={"help": "Bytes from which a batch frame's payload is lz4-compressed; 0: never."},
    )
    heartbeat_interval: float = field(
        default=0.5, metadata={"help": "Seconds between a task's heartbeats to the job manager."}
    )
    alignment_interval: float = field(
        default=0.1,
        metadata={
            "help": "Seconds between the watermark reports of a source with watermark "
            "alignment (assign_timestamps(max_drift=...)): how fresh the lowest aligned "
            "watermark is when it decides to pause (its heartbeats come this often)."
        },
    )
    heartbeat_timeout: float = field(
        default=15.0,
        metadata={
            "help": "Seconds of silence after which the job manager fails a task, "
            "and a task ends itself."
        },
    )
    progress: bool | None = field(
        default=None,
        metadata={
            "help": "The live progress line on stderr; None: only when stderr is a terminal."
        },
    )
    ui: bool = field(
        default=True,
        metadata={"help": "Serve the web dashboard, the REST API and /metrics (jobmanager.web)."},
    )
    ui_host: str = field(
        default="127.0.0.1",
        metadata={
            "help": "Address the dashboard listens on; 0.0.0.0 exposes the read-only "
            "dashboard to the network."
        },
    )
    ui_port: int = field(
        default=8081,
        metadata={
            "help": "Dashboard port; when it is taken another free port is used (and printed); "
            "0: any free port."
        },
    )
    local_master: str | None = field(
        default=None,
        metadata={"help": "Master of the embedded SparkSession; None: local[n] sized to the job."},
    )
    executor_wait: float = field(
        default=60.0,
        metadata={"help": "Seconds to wait on a cluster for enough executors to register."},
    )
    timeout: float | None = field(
        default=None,
        metadata={"help": "Seconds after which the job is cancelled; None: no limit."},
    )
    allow_non_restored_state: bool = field(
        default=False,
        metadata={
            "help": "restore_from drops (with a warning) the state of checkpointed steps the "
            "job no longer has, instead of refusing the checkpoint."
        },
    )
    debug_drop_in_flight_log: bool = field(
        default=False,
        metadata={"help": "Tests only: restore loops without their back-edge log."},
    )
    debug_restart_supersteps: bool = field(
        default=False,
        metadata={
            "help": "Tests only: a restored iteration forgets the superstep of its "
            "checkpoint and counts from 1 again (the companion of superstep checkpoints)."
        },
    )
    debug_rescue_after_send: bool = field(
        default=False,
        metadata={
            "help": "Tests only: a loop head blocked in a send serves an optimistic "
            "recovery's rescue only after the send (the companion of the rescue test)."
        },
    )
    debug_drop_event_time: bool = field(
        default=False,
        metadata={"help": "Tests only: restore without timers and watermarks."},
    )
    debug_skip_drain: bool = field(
        default=False,
        metadata={"help": "Tests only: synchronous snapshots without waiting for the drain."},
    )
    storage_options: dict[str, Any] = field(
        default_factory=dict,
        repr=False,
        hash=False,
        metadata={
            "help": "fsspec keyword arguments (endpoint, credentials) for a checkpoint_dir or "
            "restore_from URL, passed on the driver and in every task; kept out of repr."
        },
    )
    launcher: str | None = field(
        default=None,
        metadata={
            "help": "spark: each attempt is a Spark barrier stage; local: local task processes "
            "without Spark (runtime.api.testing); None: $ABSFLOW_LAUNCHER, else spark."
        },
    )
    fork_server: bool = field(
        default=True,
        metadata={
            "help": "local launcher: fork task processes from a process that imported the "
            "task side once (jobmanager.fork_server; ~0.5 s of CPU less per task process) "
            "instead of starting each afresh."
        },
    )
    fork_preload: bool | None = field(
        default=None,
        metadata={
            "help": "local launcher, with fork_server: the server also imports the modules "
            "the job's pickle refers to before it forks the job's tasks (one import instead "
            "of one per task). Module-level state is then made once and shared by the tasks "
            "(as with multiprocessing's fork): leave it off when a module opens a connection "
            "at import. None: on when $ABSFLOW_FORK_PRELOAD is 1 (the test suite sets it)."
        },
    )
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
        _check_optimistic(self.optimistic_recovery)
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
        _parse_superstep_style(self)
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
        k = self.superstep_checkpoint_interval
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
            raise GraphError(
                f"superstep_checkpoint_interval must be a whole number of supersteps >= 1 "
                f"(or None for off), got {k!r}."
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
        _check_seconds(self)
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
        return (
            self.checkpoint_interval is not None
            or self.superstep_checkpoint_interval is not None
            or self.optimistic_recovery is not None  # rescue snapshots go to the storage
        )

    def replace(self, **changes: Any) -> JobConfig:
        names = {f.name for f in dataclasses.fields(self)}
        unknown = set(changes) - names
        if unknown:
            raise GraphError(f"unknown setting(s) {sorted(unknown)}; known: {sorted(names)}.")
        return dataclasses.replace(self, **changes)


def _parse_superstep_style(config: JobConfig) -> None:
    """``superstep_checkpoint_style`` given by its name becomes the enum member."""
    style = config.superstep_checkpoint_style
    if isinstance(style, SuperstepCheckpointStyle):
        return
    try:
        object.__setattr__(config, "superstep_checkpoint_style", SuperstepCheckpointStyle(style))
    except ValueError:
        styles = ", ".join(repr(m.value) for m in SuperstepCheckpointStyle)
        raise GraphError(
            f"superstep_checkpoint_style {style!r} is unknown; use one of {styles}."
        ) from None


def _check_switches(config: JobConfig) -> None:
    """The settings that are on/off switches."""
    if config.state_backend not in STATE_BACKENDS:
        raise GraphError(
            f"state_backend must be one of {list(STATE_BACKENDS)}, got {config.state_backend!r}."
        )
    budget = config.state_memory_budget_mb
    if budget is not None and (
        isinstance(budget, bool) or not isinstance(budget, int | float) or budget <= 0
    ):
        raise GraphError(
            f"state_memory_budget_mb must be a number of MiB > 0 (or None: no budget), "
            f"got {budget!r}."
        )
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


def _check_seconds(config: JobConfig) -> None:
    """The settings that are durations > 0."""
    for name in ("alignment_interval",):
        value = getattr(config, name)
        if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
            raise GraphError(f"{name} must be > 0 seconds, got {value!r}.")


def _check_counts(config: JobConfig) -> None:
    """The settings that are whole numbers: counts (>= 1) and byte sizes (>= 0)."""
    for name in (
        "batch_size",
        "channel_hwm",
        "max_concurrent_checkpoints",
        "retained_checkpoints",
        "incremental_max_chain",
    ):
        value = getattr(config, name)
        if not isinstance(value, int) or value < 1:
            raise GraphError(f"{name} must be an int >= 1, got {value!r}.")
    for name, zero in (
        ("socket_buffer", "0 for the OS default"),
        ("state_inline_threshold", "0 writes every task state to a file"),
        ("incremental_min_keys", "keys; 0 chains every keyed state"),
    ):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise GraphError(f"{name} must be an int >= 0 (bytes; {zero}), got {value!r}.")
