"""Command line of the job manager: ``python -m jobmanager checkpoints DIR [--show N]``.

Reads a checkpoint root (``statebackend.storage`` layout) without changing it:
lists its checkpoints, or prints one checkpoint's metadata and verifies its state
files. Exit codes: 0 fine, 1 the shown checkpoint is corrupt, 2 usage error (no
such directory, no such checkpoint).
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from statebackend.errors import CheckpointNotFoundError, CorruptCheckpointError
from statebackend.storage import METADATA, CheckpointStorage

_CHK = re.compile(r"chk-(\d+)")

SUMMARY_METRICS = (
    "duration_ms",
    "max_start_delay_ms",
    "max_alignment_ms",
    "mean_alignment_ms",
    "max_sync_ms",
    "max_async_ms",
    "state_bytes",
    "spilled_bytes",
    "keys",
)
TASK_METRICS = (
    "start_delay_ms",
    "alignment_ms",
    "sync_ms",
    "async_ms",
    "state_bytes",
    "spilled_bytes",
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
def _open_root(directory: str) -> CheckpointStorage:
    if not os.path.isdir(directory):
        what = "is not a directory" if os.path.exists(directory) else "does not exist"
        raise UsageError(f"checkpoint root {directory!r} {what}")
    return CheckpointStorage(directory)  # exists: the constructor creates nothing


def checkpoint_ids(directory: str) -> list[int]:
    """Ids of the ``chk-<n>`` directories, ascending (complete or not)."""
    ids = [
        int(m.group(1))
        for name in os.listdir(directory)
        if (m := _CHK.fullmatch(name)) and os.path.isdir(os.path.join(directory, name))
    ]
    return sorted(ids)


def _status(storage: CheckpointStorage, n: int) -> tuple[str, dict[str, Any] | None]:
    """("completed" | "incomplete" | "corrupt", metadata if readable)."""
    try:
        return "completed", storage.check(n)
    except CheckpointNotFoundError:
        return "incomplete", None
    except CorruptCheckpointError:
        try:
            return "corrupt", storage.read_metadata(n)
        except (CheckpointNotFoundError, CorruptCheckpointError):
            return "corrupt", None


# -- commands ------------------------------------------------------------------------------
def list_checkpoints(directory: str, out: TextIO) -> int:
    storage = _open_root(directory)
    ids = checkpoint_ids(storage.root)
    if not ids:
        out.write(f"no checkpoints in {storage.root}\n")
        return 0
    rows = []
    for n in ids:
        status, meta = _status(storage, n)
        meta = meta or {}
        metrics = meta.get("metrics", {})
        tasks = metrics.get("tasks", len(meta.get("task_metrics", {})) if meta else None)
        rows.append(
            [
                n,
                status,
                meta.get("final") if meta else None,
                meta.get("attempt"),
                _time(meta.get("trigger_time")),
                meta.get("duration_ms", metrics.get("duration_ms")),
                metrics.get("state_bytes"),
                tasks,
                metrics.get("max_alignment_ms"),
                metrics.get("spilled_bytes"),
            ]
        )
    out.write(f"checkpoints in {storage.root}\n")
    out.write(
        table(
            [
                "id",
                "status",
                "final",
                "attempt",
                "triggered",
                "duration_ms",
                "state_bytes",
                "tasks",
                "max_align_ms",
                "spilled_bytes",
            ],
            rows,
        )
        + "\n"
    )
    return 0


def _operators(info: Any) -> str:
    ops = info.get("operators") if isinstance(info, dict) else None
    if isinstance(ops, dict):
        parts = []
        for name, layout in ops.items():
            kgs = layout.get("key_groups") if isinstance(layout, dict) else None
            parts.append(f"{name} (key groups {kgs[0]}..{kgs[1] - 1})" if kgs else name)
        return ", ".join(parts)
    return "-" if ops is None else str(ops)


def show_checkpoint(directory: str, n: int, out: TextIO, err: TextIO) -> int:
    storage = _open_root(directory)
    path = os.path.join(storage.root, f"chk-{n}")
    if not os.path.isdir(path):
        known = ", ".join(map(str, checkpoint_ids(storage.root))) or "none"
        raise UsageError(f"no checkpoint {n} in {storage.root} (checkpoints: {known})")
    if not os.path.isfile(os.path.join(path, METADATA)):
        raise UsageError(
            f"checkpoint {n} in {storage.root} is incomplete: it has no {METADATA} "
            "(in progress, or aborted)"
        )
    try:
        meta = storage.read_metadata(n)
    except CorruptCheckpointError as error:
        err.write(f"checkpoint {n} is CORRUPT: {error}\n")
        return 1

    out.write(f"checkpoint {n} of job {meta.get('job', '?')!r} in {path}\n")
    out.write(
        f"  attempt {_cell(meta.get('attempt'))}, final {_cell(meta.get('final'))}, "
        f"max parallelism {_cell(meta.get('max_parallelism'))}\n"
    )
    out.write(
        f"  triggered {_time(meta.get('trigger_time'))}, "
        f"completed {_time(meta.get('completed_time'))}\n\n"
    )

    metrics = meta.get("metrics", {})
    out.write("summary\n")
    width = max(len(k) for k in SUMMARY_METRICS)
    for key in SUMMARY_METRICS:
        value = metrics.get(key)
        out.write(f"  {key.ljust(width)}  {'-' if value is None else value}\n")

    task_metrics: dict[str, Any] = meta.get("task_metrics", {})
    out.write(f"\ntasks ({len(task_metrics)})\n")
    rows = [[task, *(m.get(k) for k in TASK_METRICS)] for task, m in task_metrics.items()]
    out.write(table(["task", *TASK_METRICS], rows) + "\n")

    files: dict[str, Any] = meta.get("tasks", {})
    out.write(f"\nstate files ({len(files)})\n")
    rows = [
        [
            task,
            info.get("file"),
            info.get("size"),
            f"{info.get('crc32', 0):#010x}",
            _operators(info),
        ]
        for task, info in files.items()
        if isinstance(info, dict)
    ]
    out.write(table(["task", "file", "size", "crc32", "operators"], rows) + "\n\n")

    try:
        storage.check(n)
    except (CheckpointNotFoundError, CorruptCheckpointError) as error:
        out.write(f"verification: CORRUPT: {error}\n")
        return 1
    count = (
        "1 state file matches its" if len(files) == 1 else f"{len(files)} state files match their"
    )
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
    chk.add_argument("directory", metavar="DIR", help="checkpoint root (holds chk-<n> directories)")
    chk.add_argument(
        "--show", metavar="N", type=int, help="print checkpoint N in detail and verify it"
    )
    return parser


def main(
    argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run the command line; returns the exit code (argparse exits 2 on bad usage)."""
    out = out or sys.stdout
    err = err or sys.stderr
    args = build_parser().parse_args(argv)
    try:
        if args.show is not None:
            return show_checkpoint(args.directory, args.show, out, err)
        return list_checkpoints(args.directory, out)
    except UsageError as error:
        err.write(f"error: {error}\n")
        return 2
    except OSError as error:  # e.g. permission denied: still no traceback
        err.write(f"error: {error}\n")
        return 2
