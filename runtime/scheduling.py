"""How the OS schedules a task process's threads (``JobConfig.task_scheduling``).

A job's task processes are throughput-bound and, on a small machine, share its cores:
at parallelism 2 on two cores four processes (two sources, two aggregates) take turns.
Under Linux's default policy (``SCHED_OTHER``) a process woken by a frame on its input
preempts the one running, mid-batch, ~1,250 times a second per process; each switch
costs the switch itself and the caches the other process refills. ``"batch"`` runs the
task under ``SCHED_BATCH``: the same fair share of the CPU, but a waking task waits for
the running one's slice instead of preempting it. Measured on the keyed count at p = 2
(``python benchmarks/throughput.py --compare-scheduling``): involuntary switches ~170 per second
per process, the ZeroMQ I/O threads' CPU halved, a few per cent more records per second
(at the edge of the machine's noise), aligned checkpoints slightly shorter.
``"normal"`` leaves the OS's policy.

The policy is set on the calling thread before it creates the task's ZeroMQ context, so
the context's I/O threads inherit it, and restored when the task ends (a Spark Python
worker may be reused for other tasks). Where the OS has no ``SCHED_BATCH`` (not Linux)
or refuses it (a seccomp profile), the task runs under the OS's policy: the setting is a
hint for throughput, never a reason to fail a task.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

TASK_SCHEDULING = ("batch", "normal")


@contextlib.contextmanager
def task_scheduling(policy: str) -> Iterator[bool]:
    """Run the body under ``policy`` (one of ``TASK_SCHEDULING``) on this thread and the
    threads it starts; yields whether the policy was changed (False: the OS's kept)."""
    restore = _enter(policy)
    try:
        yield restore is not None
    finally:
        if restore is not None:
            with contextlib.suppress(OSError):
                os.sched_setscheduler(0, *restore)


def _enter(policy: str) -> tuple[int, os.sched_param] | None:
    """Switch this thread to ``policy``; the policy to restore, or None if unchanged."""
    batch = getattr(os, "SCHED_BATCH", None)
    if policy != "batch" or batch is None:
        return None
    try:
        before = os.sched_getscheduler(0), os.sched_getparam(0)
        if before[0] == batch:
            return None
        os.sched_setscheduler(0, batch, os.sched_param(0))
    except OSError:
        return None
    return before
