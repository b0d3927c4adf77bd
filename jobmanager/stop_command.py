"""``python -m jobmanager stop JOB``: stop a job running on this machine with a savepoint.

Finds the job's driver in the registry of running drivers (``jobmanager.stop``), asks it
to stop (a stop file it polls), waits until the driver has exited and prints the
savepoint it left in its checkpoint root. Exit codes: 0 stopped (with a savepoint when
the job checkpoints into a ``checkpoint_dir``), 1 the driver did not exit within
``--timeout``, 2 no such job (the message lists the running ones).
"""

from __future__ import annotations

import argparse
import time
from typing import Any, TextIO

from jobmanager.liveness import pid_alive
from jobmanager.stop import RunningJob, request_stop, running_jobs
from statebackend.errors import StateError
from statebackend.storage import CheckpointStorage


def add_parser(commands: Any) -> None:
    stop = commands.add_parser(
        "stop",
        help="stop a running job with a savepoint",
        description="Stop a job running on this machine: its sources end at one point, a "
        "final checkpoint is kept as a savepoint, the sinks commit and the driver exits. "
        "Resume it with run(restore_from=SAVEPOINT).",
    )
    stop.add_argument("job", metavar="JOB", help="the job's name (Dataflow(name))")
    stop.add_argument(
        "--pid", type=int, help="the driver's pid, when several drivers run a job of that name"
    )
    stop.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds to wait for the driver to exit (default 120)",
    )
    stop.add_argument(
        "--no-wait", action="store_true", help="ask the driver to stop and return at once"
    )
    stop.add_argument(
        "--drain",
        action="store_true",
        help="end event time before the savepoint: every window and timer fires and its "
        "output commits (for a job that will not resume; without it, open windows stay in "
        "the savepoint and fire after a resume)",
    )


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    running = running_jobs()
    matches = [j for j in running if j.job == args.job and args.pid in (None, j.pid)]
    if not matches:
        known = ", ".join(f"{j.job} (pid {j.pid})" for j in running) or "none"
        err.write(
            f"error: no job named {args.job!r} runs on this machine (running: {known}); "
            "`stop` reaches drivers started by this user on this machine only\n"
        )
        return 2
    if len(matches) > 1:
        pids = ", ".join(str(j.pid) for j in matches)
        err.write(f"error: {len(matches)} drivers run job {args.job!r} (pids {pids}); pass --pid\n")
        return 2
    job = matches[0]
    asked = time.time()
    request_stop(job, drain=args.drain)
    out.write(f"asked job {job.job!r} (driver pid {job.pid}) to stop with a savepoint\n")
    if args.no_wait:
        return 0
    deadline = time.monotonic() + args.timeout
    while pid_alive(job.pid):
        if time.monotonic() > deadline:
            err.write(
                f"error: the driver (pid {job.pid}) did not exit within {args.timeout:g} s; "
                "it may still be writing the savepoint (its log says), or send it SIGINT "
                "twice to abort without one\n"
            )
            return 1
        time.sleep(0.05)
    out.write(_outcome(job, asked) + "\n")
    return 0


def _outcome(job: RunningJob, asked: float) -> str:
    if job.checkpoint_dir is None:
        return f"job {job.job!r} stopped (it had no checkpoint_dir, so no savepoint was kept)"
    try:
        storage = CheckpointStorage(job.checkpoint_dir)
        ids = [n for n in storage.savepoints() if storage.read_metadata(n).completed_time >= asked]
    except (StateError, OSError) as error:
        return f"job {job.job!r} stopped; cannot read its checkpoint root: {error}"
    if not ids:
        return (
            f"job {job.job!r} stopped without a savepoint in {job.checkpoint_dir} "
            "(it failed, or ended before the request; see its log)"
        )
    return f"job {job.job!r} stopped with savepoint {storage.location(ids[-1])}"
