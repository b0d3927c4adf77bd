"""The iteration examples' fault flags: ``--kill-task STEP[i] --after superstep:K`` and
``--chaos K`` (K kills at random supersteps), plus ``--recovery`` / ``--interval``,
turned into the (task, superstep) kills and the ``Recovery`` an iteration runs with.
The flags themselves are ``jobmanager.faultargs``' (shared with the streaming examples).
"""

from __future__ import annotations

import argparse
import json
import random
import re
from typing import Any

from runtime.iterations.api import RECOVERY_MODES, Compensation, Recovery

__all__ = ["add_recovery_arguments", "iteration_kills", "recovery_from"]

_TASK = re.compile(r"(?:([A-Za-z_][\w.-]*)\[)?(\d+)\]?")


def add_recovery_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--recovery",
        choices=RECOVERY_MODES,
        default="optimistic",
        help="optimistic: rescue + compensation (no checkpoints); blocking/tail/head: "
        "superstep checkpoints every --interval supersteps; none: restart from the start",
    )
    parser.add_argument(
        "--interval",
        type=int,
        default=None,
        help="checkpoint every K supersteps (default: sqrt of the expected count)",
    )
    parser.add_argument(
        "--checkpoint-dir",
        default=None,
        help="superstep checkpoints here: a path or a storage URL such as s3://bucket/prefix "
        "(default: a temp dir)",
    )
    parser.add_argument(
        "--storage-options",
        type=_json_object,
        default=None,
        metavar="JSON",
        help='fsspec options of --checkpoint-dir, e.g. \'{"endpoint_url": "http://..."}\'',
    )


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"--storage-options is not JSON: {err}") from err
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("--storage-options must be a JSON object")
    return value


def recovery_from(args: Any, compensation: Compensation, expected_supersteps: int) -> Recovery:
    interval = args.interval or max(1, round(expected_supersteps**0.5))  # seed 004: k ~ sqrt(n)
    return Recovery(
        args.recovery,
        interval=interval,
        compensation=compensation if args.recovery == "optimistic" else None,
        checkpoint_dir=args.checkpoint_dir,
        storage_options=args.storage_options,
        max_restarts=max(3, (args.chaos or 0) + 1),
    )


def iteration_kills(
    parser: argparse.ArgumentParser,
    args: Any,
    step: str,
    parallelism: int,
    expected_supersteps: int,
) -> list[tuple[int, int]]:
    """(task index, superstep) pairs; bad flags end through ``parser.error``."""
    kills: list[tuple[int, int]] = []
    if args.after is not None and not args.kill_task:
        parser.error("--after needs --kill-task")
    if args.kill_task:
        m = _TASK.fullmatch(args.kill_task.strip())
        if m is None or (m.group(1) not in (None, step)) or int(m.group(2)) >= parallelism:
            parser.error(
                f"--kill-task {args.kill_task}: the iteration's tasks are {step}[0] .. {step}[{parallelism - 1}]"
            )
        if args.after is None or args.after.superstep is None:
            parser.error("--kill-task in an iteration needs --after superstep:K")
        kills.append((int(m.group(2)), args.after.superstep))
    if args.chaos:
        rng = random.Random(args.seed)
        last = max(2, expected_supersteps - 1)  # the superstep before the last one
        steps = sorted(rng.sample(range(2, last + 1), min(args.chaos, last - 1)))
        kills.extend((rng.randrange(parallelism), k) for k in steps)
    return kills
