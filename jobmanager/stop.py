"""Stopping a running job with a savepoint: the request, where it comes from, and how
the command line finds the driver.

A stop is requested by

* ``SIGTERM`` or the first Ctrl-C (SIGINT) in the driver (``stop_signals``); a second
  one aborts at once (KeyboardInterrupt: the job is cancelled, its tasks ended);
* ``python -m jobmanager stop JOB`` on the driver's machine: every running driver
  registers itself as a small JSON file in ``jobs_dir()`` (``JobEntry``), and the
  command writes a stop file next to it, which the job manager polls (no socket, no
  port: only the driver's user can ask);
* code: ``StopRequest.request(reason)``.

The job manager turns the request into a final aligned checkpoint kept as a savepoint
(``CheckpointCoordinator.stop_with_savepoint``). Driver side, job-manager thread only
(the signal handlers only set a flag).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jobmanager.liveness import pid_alive

if TYPE_CHECKING:
    from jobmanager.coordinator import CheckpointCoordinator

log = logging.getLogger("absflow.jobmanager")

POLL_SECONDS = 0.1  # how often the job manager looks for a stop file
DRAIN = "drain"  # the first line of a stop file that asks for a drain


class StopRequest:
    """Whether (and why) the job was asked to stop with a savepoint. ``request_file``:
    a path whose existence is a request (written by ``python -m jobmanager stop``)."""

    def __init__(
        self, request_file: str | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.request_file = request_file
        self.clock = clock
        self.reason: str | None = None
        self.drain = False  # end event time before the savepoint (Flink's --drain)
        self.requested_at: float | None = None  # wall clock
        self._next_poll = 0.0

    def request(self, reason: str, drain: bool = False) -> None:
        """Ask for a stop; ``drain``: fire every window and timer before the savepoint."""
        if self.reason is None:
            self.reason, self.requested_at, self.drain = reason, time.time(), drain

    @property
    def requested(self) -> bool:
        if self.reason is None and self.request_file is not None:
            now = self.clock()
            if now >= self._next_poll:
                self._next_poll = now + POLL_SECONDS
                with contextlib.suppress(FileNotFoundError), open(self.request_file) as fh:
                    drain = fh.readline().strip() == DRAIN
                    self.request(f"`python -m jobmanager stop` ({self.request_file})", drain)
        return self.reason is not None


def begin_stop(
    coordinator: CheckpointCoordinator,
    stop: StopRequest,
    attempt: int,
    superstep: int | None = None,
) -> int:
    """Act on a stop request in a running attempt (every task registered): trigger the
    final checkpoint kept as a savepoint. Returns its id, or -1 when the input had ended
    first (that final checkpoint becomes the savepoint, unless it was taken incrementally:
    the coordinator keeps it as a checkpoint then).

    A job with a loop stops the same way (cyclic ABS, docs/loops.md): the final barrier
    ends the sources, each loop head snapshots on it and logs what comes back on its
    back-edges until the barrier has gone round the loop, and that log is part of the
    savepoint; the resumed job's loop heads replay it first. Records processed after
    the barrier only reach transactions the savepoint does not commit.

    An iteration stops at a superstep boundary (``jobmanager.supersteps``): ``superstep``
    is recorded in the savepoint, and the resumed job goes on after it."""
    n = coordinator.stop_with_savepoint(stop.drain, superstep)
    log.warning(
        "attempt %d: stopping with a savepoint (%s): %s",
        attempt,
        f"{stop.reason}{', draining event time' if stop.drain else ''}",
        f"final checkpoint {n} triggered"
        if n is not None
        else "the input ended first, its final checkpoint is the savepoint if self-contained",
    )
    return -1 if n is None else n


@contextlib.contextmanager
def stop_signals(stop: StopRequest, job: str) -> Iterator[None]:
    """While the job runs: SIGTERM and the first Ctrl-C request a stop with savepoint;
    a second one raises KeyboardInterrupt (abort at once). Main thread only (elsewhere
    Python cannot install handlers: ``python -m jobmanager stop`` still works)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if stop.reason is not None:
            log.warning("%s again: aborting job '%s' at once, without a savepoint", name, job)
            raise KeyboardInterrupt
        stop.request("Ctrl-C" if signum == signal.SIGINT else name)
        log.warning(
            "%s: stopping job '%s' with a savepoint (press Ctrl-C again to abort at once)",
            name,
            job,
        )

    previous: dict[int, Any] = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
    except ValueError:  # not the main interpreter
        pass
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# -- the registry of running drivers (for `python -m jobmanager stop`) ---------------------
def jobs_dir() -> str:
    """Where running drivers register: ``$ABSFLOW_JOBS_DIR``, or a directory of the
    user's own in the temp dir."""
    configured = os.environ.get("ABSFLOW_JOBS_DIR")
    if configured:
        return configured
    return os.path.join(tempfile.gettempdir(), f"absflow-jobs-{os.getuid()}")


def _file_stem(job: str, pid: int) -> str:
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', job)}.{pid}"


@dataclass(frozen=True)
class RunningJob:
    """A registered driver: the job's name, the driver's pid, its checkpoint root."""

    job: str
    pid: int
    started: float
    checkpoint_dir: str | None
    path: str

    @property
    def stop_file(self) -> str:
        return self.path[: -len(".json")] + ".stop"


class JobEntry:
    """The driver's registration while its job runs (a context manager): a JSON file
    ``<job>.<pid>.json`` in ``jobs_dir()``, removed with its stop file at the end."""

    def __init__(self, job: str, checkpoint_dir: str | None, directory: str | None = None):
        self.directory = directory or jobs_dir()
        stem = _file_stem(job, os.getpid())
        self.path = os.path.join(self.directory, stem + ".json")
        self.stop_file = os.path.join(self.directory, stem + ".stop")
        self.body = {
            "job": job,
            "pid": os.getpid(),
            "started": time.time(),
            "checkpoint_dir": checkpoint_dir,
        }

    def __enter__(self) -> JobEntry:
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.stop_file)  # a request left by an earlier driver of this pid
            tmp = self.path + ".tmp"
            with open(tmp, "w") as fh:
                json.dump(self.body, fh)
            os.replace(tmp, self.path)
        except OSError as err:  # the job runs anyway; only the CLI cannot find it
            log.warning(
                "cannot register the job in %s (%s): `stop` cannot reach it", self.path, err
            )
        return self

    def __exit__(self, *_exc: object) -> None:
        for path in (self.path, self.stop_file):
            with contextlib.suppress(OSError):
                os.remove(path)
        with contextlib.suppress(OSError):  # the last driver leaves no directory behind
            os.rmdir(self.directory)


def running_jobs(directory: str | None = None) -> list[RunningJob]:
    """The registered drivers whose process is alive (stale entries are removed)."""
    directory = directory or jobs_dir()
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    found = []
    for name in names:
        if not name.endswith(".json"):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path) as fh:
                body = json.load(fh)
            job = RunningJob(
                str(body["job"]),
                int(body["pid"]),
                float(body["started"]),
                body.get("checkpoint_dir"),
                path,
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if pid_alive(job.pid):
            found.append(job)
        else:
            for stale in (path, job.stop_file):
                with contextlib.suppress(OSError):
                    os.remove(stale)
    return found


def request_stop(job: RunningJob, drain: bool = False) -> None:
    """Ask ``job``'s driver to stop with a savepoint (it polls for the file); ``drain``:
    end event time first (every window fires before the savepoint). Written whole, then
    renamed: the driver never reads half a request."""
    tmp = job.stop_file + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(f"{DRAIN if drain else 'stop'}\nrequested by pid {os.getpid()} at {time.time()}\n")
    os.replace(tmp, job.stop_file)
