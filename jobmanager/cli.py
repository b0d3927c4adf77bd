"""Command line of the job manager:

    python -m jobmanager checkpoints DIR [--show N] [--storage-option KEY=VALUE ...]
    python -m jobmanager stop JOB [--timeout S] [--no-wait] [--drain]
    python -m jobmanager package [--out DIR] [--env]
    python -m jobmanager submit --master URL [--deploy-mode M] [--env E] [--conf K=V] script.py ...

``package`` and ``submit`` live in ``jobmanager.submit``, ``stop`` (stop a job running
on this machine with a savepoint) in ``jobmanager.stop_command``. ``checkpoints`` reads a
checkpoint root through ``statebackend.storage.CheckpointStorage`` without changing it:
lists its checkpoints, or prints one checkpoint's metadata and verifies its state files.
DIR is a path or a URL (``s3://bucket/prefix``); the storage options a URL needs
(endpoint, credentials) come from ``--storage-option KEY=VALUE`` (repeated), or from
fsspec's environment variables (``FSSPEC_S3_ENDPOINT_URL=...``, or
``FSSPEC_S3='{"endpoint_url": ...}'``) and the cloud SDK's own (``AWS_ACCESS_KEY_ID``,
...). Exit codes: 0 fine, 1 the shown checkpoint is corrupt, 2 usage error (no such
directory, no such checkpoint, storage that cannot be read; a packaging or submit error).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from jobmanager import stop_command, submit
from statebackend.errors import StateError
from statebackend.metadata import CheckpointMetadata, TaskStateHandle
from statebackend.storage import METADATA, CheckpointInfo, CheckpointStatus, CheckpointStorage

SUMMARY_METRICS = (
    "duration_ms",
    "max_start_delay_ms",
    "max_alignment_ms",
    "mean_alignment_ms",
    "max_sync_ms",
    "max_async_ms",
    "critical_task",
    "queueing_ms",
    "alignment_ms",
    "write_ms",
    "state_bytes",
    "full_state_bytes",
    "spilled_bytes",
    "keys",
    "backedge_records",
    "backedge_bytes",
)
TASK_METRICS = (
    "start_delay_ms",
    "alignment_ms",
    "sync_ms",
    "async_ms",
    "state_bytes",
    "full_state_bytes",
    "spilled_bytes",
    "backedge_records",
    "watermark",
)


class UsageError(Exception):
    """Bad input the user can fix (exit code 2)."""


# -- formatting --------------------------------------------------------------------------
def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def _is_number(text: str) -> bool:
    return bool(re.fullmatch(r"-?[\d.]+", text))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to their widest cell; numbers right-aligned."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    numeric = [
        bool(cells) and all(_is_number(r[i]) or r[i] == "-" for r in cells)
        for i in range(len(headers))
    ]

    def line(row: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if num else c.ljust(w)
            for c, w, num in zip(row, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(list(headers)), line(["-" * w for w in widths]), *map(line, cells)])


def _time(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "-"
    return datetime.datetime.fromtimestamp(ts).isoformat(sep=" ", timespec="milliseconds")


# -- reading -------------------------------------------------------------------------------
def _open_root(directory: str, options: dict[str, Any]) -> CheckpointStorage:
    # no I/O: inspecting must not create the root
    storage = CheckpointStorage(directory, storage_options=options)
    if not storage.exists():
        if "://" in directory and not directory.startswith("file://"):
            raise UsageError(f"checkpoint root {directory!r} does not exist or holds nothing")
        what = "is not a directory" if os.path.exists(directory) else "does not exist"
        raise UsageError(f"checkpoint root {directory!r} {what}")
    return storage


def storage_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE``: VALUE as JSON when it parses (numbers, true, objects), else a string."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


# -- commands ------------------------------------------------------------------------------
def _row(info: CheckpointInfo) -> list[Any]:
    meta = info.metadata
    if meta is None:
        return [info.checkpoint_id, info.status.value, *([None] * 14)]
    metrics = meta.metrics
    return [
        info.checkpoint_id,
        info.status.value,
        meta.final,
        meta.savepoint,
        meta.superstep,
        metrics.mode or None,
        meta.attempt,
        _time(meta.trigger_time),
        meta.duration_ms,
        metrics.state_bytes,
        metrics.full_state_bytes or metrics.state_bytes,
        metrics.tasks or len(meta.task_metrics),
        metrics.max_alignment_ms,
        metrics.spilled_bytes,
        metrics.backedge_bytes,
        metrics.channel_state_bytes,
    ]


def list_checkpoints(directory: str, out: TextIO, options: dict[str, Any] | None = None) -> int:
    storage = _open_root(directory, options or {})
    listed = storage.list()
    if not listed:
        out.write(f"no checkpoints in {storage.root}\n")
        return 0
    out.write(f"checkpoints in {storage.root}\n")
    out.write(
        table(
            [
                "id",
                "status",
                "final",
                "savepoint",
                "superstep",
                "mode",
                "attempt",
                "triggered",
                "duration_ms",
                "written_bytes",
                "state_bytes",
                "tasks",
                "max_align_ms",
                "spilled_bytes",
                "backedge_bytes",
                "channel_state_bytes",
            ],
            [_row(info) for info in listed],
        )
        + "\n"
    )
    return 0


def _operators(handle: TaskStateHandle) -> str:
    parts = []
    for name, layout in handle.operators.items():
        kgs = layout.key_groups
        parts.append(f"{name} (key groups {kgs[0]}..{kgs[1] - 1})" if kgs else name)
    return ", ".join(parts) or "-"


def _print_metadata(meta: CheckpointMetadata, path: str, out: TextIO) -> None:
    out.write(f"checkpoint {meta.checkpoint_id} of job {meta.job!r} in {path}\n")
    out.write(
        f"  attempt {_cell(meta.attempt)}, final {_cell(meta.final)}, "
        f"savepoint {_cell(meta.savepoint)}, "
        + (f"superstep {meta.superstep}, " if meta.superstep is not None else "")
        + f"max parallelism {_cell(meta.max_parallelism)}\n"
    )
    if meta.rescue is not None:  # a partial checkpoint: an iteration's surviving loop heads
        out.write(f"  {meta.rescue.describe()}\n")
    out.write(f"  triggered {_time(meta.trigger_time)}, completed {_time(meta.completed_time)}\n\n")
    out.write("summary\n")
    width = max(len(k) for k in SUMMARY_METRICS)
    for key in SUMMARY_METRICS:
        value = getattr(meta.metrics, key)
        out.write(f"  {key.ljust(width)}  {'-' if value is None else value}\n")

    out.write(f"\ntasks ({len(meta.task_metrics)})\n")
    rows = [[task, *(getattr(m, k) for k in TASK_METRICS)] for task, m in meta.task_metrics.items()]
    out.write(table(["task", *TASK_METRICS], rows) + "\n")

    out.write(f"\ntask states ({len(meta.tasks)}; inline: held in _metadata)\n")
    files = [
        [task, h.describe(), h.size, f"{h.crc32:#010x}", _operators(h)]
        for task, h in meta.tasks.items()
    ]
    out.write(table(["task", "file", "size", "crc32", "operators"], files) + "\n\n")


def show_checkpoint(
    directory: str, n: int, out: TextIO, err: TextIO, options: dict[str, Any] | None = None
) -> int:
    storage = _open_root(directory, options or {})
    ids = storage.checkpoint_ids()
    if n not in ids:
        known = ", ".join(map(str, ids)) or "none"
        raise UsageError(f"no checkpoint {n} in {storage.root} (checkpoints: {known})")
    info = storage.status(n)
    if info.status is CheckpointStatus.INCOMPLETE:
        raise UsageError(
            f"checkpoint {n} in {storage.root} is incomplete: it has no {METADATA} "
            "(in progress, or aborted)"
        )
    if info.metadata is None:
        err.write(f"checkpoint {n} is CORRUPT: {info.problem}\n")
        return 1
    _print_metadata(info.metadata, storage.location(n), out)
    if info.status is CheckpointStatus.CORRUPT:
        out.write(f"verification: CORRUPT: {info.problem}\n")
        return 1
    files = len(info.metadata.tasks)
    count = "1 task state matches its" if files == 1 else f"{files} task states match their"
    out.write(f"verification: OK ({count} recorded size and checksums)\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m jobmanager", description="absflow job manager tools"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    chk = commands.add_parser(
        "checkpoints",
        help="list or inspect the checkpoints in a root",
        description="List the checkpoints in a checkpoint root, or show one.",
    )
    chk.add_argument(
        "directory",
        metavar="DIR",
        help="checkpoint root (holds chk-<n> directories): a path or a URL (s3://bucket/prefix)",
    )
    chk.add_argument(
        "--storage-option",
        metavar="KEY=VALUE",
        type=storage_option,
        action="append",
        default=[],
        help="fsspec storage option for a URL, repeated (e.g. endpoint_url=http://host:9000, "
        "key=..., secret=...); VALUE is parsed as JSON when it can be",
    )
    chk.add_argument(
        "--show", metavar="N", type=int, help="print checkpoint N in detail and verify it"
    )
    submit.add_parsers(commands)
    stop_command.add_parser(commands)
    return parser


def main(
    argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run the command line; returns the exit code (argparse exits 2 on bad usage)."""
    out = out or sys.stdout
    err = err or sys.stderr
    args = build_parser().parse_args(argv)
    if args.command == "stop":
        return stop_command.run(args, out, err)
    if args.command != "checkpoints":
        return submit.run(args, out, err)
    options = dict(args.storage_option)
    try:
        if args.show is not None:
            return show_checkpoint(args.directory, args.show, out, err, options)
        return list_checkpoints(args.directory, out, options)
    except (UsageError, StateError) as error:
        err.write(f"error: {error}\n")
        return 2
    except OSError as error:  # e.g. permission denied: still no traceback
        err.write(f"error: {error}\n")
        return 2
