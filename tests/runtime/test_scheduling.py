"""``JobConfig.task_scheduling``: the OS policy a task process's threads run under
(runtime.scheduling), set for the task and restored after it; and end to end, what the
task processes of a real run (local launcher) report from inside a map function."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from runtime import Dataflow, GraphError
from runtime.api.testing import run_local
from runtime.config import JobConfig
from runtime.scheduling import task_scheduling
from runtime.sources import GeneratorSource


def _in_thread(fn: Any) -> Any:
    """``fn()`` on a fresh thread (its policy changes affect that thread only)."""
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(fn()))
    thread.start()
    thread.join()
    return box[0]


def _refused() -> bool:
    """Whether this OS has no SCHED_BATCH or refuses it to us (a seccomp profile)."""
    if not hasattr(os, "SCHED_BATCH"):
        return True

    def probe() -> bool:
        with task_scheduling("batch") as changed:
            return not changed

    refused: bool = _in_thread(probe)
    return refused


needs_batch = pytest.mark.skipif(
    _refused(), reason="this OS has no SCHED_BATCH (not Linux) or refuses to set it"
)


@needs_batch
def test_batch_sets_sched_batch_for_the_body_and_threads_it_starts_then_restores() -> None:
    def body() -> tuple[bool, int, int, int]:
        before = os.sched_getscheduler(0)
        with task_scheduling("batch") as changed:
            inside = os.sched_getscheduler(0)
            started = _in_thread(lambda: os.sched_getscheduler(0))
        return changed, before, inside, started

    changed, before, inside, started = _in_thread(body)
    assert before == os.SCHED_OTHER
    assert changed and inside == os.SCHED_BATCH and started == os.SCHED_BATCH
    assert _in_thread(lambda: os.sched_getscheduler(0)) == os.SCHED_OTHER


@needs_batch
def test_the_policy_is_restored_when_the_body_raises() -> None:
    def body() -> int:
        with pytest.raises(ValueError), task_scheduling("batch"):
            raise ValueError("task failed")
        return os.sched_getscheduler(0)

    assert _in_thread(body) == os.SCHED_OTHER


@needs_batch
def test_normal_leaves_the_os_policy() -> None:
    def body() -> tuple[bool, int]:
        with task_scheduling("normal") as changed:
            return changed, os.sched_getscheduler(0)

    assert _in_thread(body) == (False, os.SCHED_OTHER)


def test_an_unknown_policy_is_refused_with_the_choices() -> None:
    with pytest.raises(GraphError, match="task_scheduling 'fifo' is unknown; use 'batch'"):
        JobConfig(task_scheduling="fifo")


def _policies(**config: Any) -> set[int]:
    """The scheduling policy every task process of a 2 x 2 keyed job ran its records under."""
    flow = Dataflow("policies", parallelism=2, **config)
    (
        flow.source(GeneratorSource(lambda i: i % 10, 400), name="numbers")
        .map(lambda x: (x, os.sched_getscheduler(0)), name="at_source")
        .key_by(lambda r: r[0])
        .map(lambda r: [r[1], os.sched_getscheduler(0)], name="at_keyed")
        .collect("out")
    )
    out = run_local(flow, progress=False, ui=False).output("out")
    assert len(out) == 400
    return {p for pair in out for p in pair}


@needs_batch
@pytest.mark.harness
def test_task_processes_run_under_sched_batch_by_default() -> None:
    assert _policies() == {os.SCHED_BATCH}


@needs_batch
@pytest.mark.harness
def test_with_normal_scheduling_they_run_under_the_os_policy() -> None:
    # The companion: the check above fails when the mechanism is off.
    assert _policies(task_scheduling="normal") == {os.SCHED_OTHER}
