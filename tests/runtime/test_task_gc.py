"""``JobConfig.gc_threshold``: the young-generation threshold of Python's cyclic
collector in a task process, with what the task built before its first record frozen
(runtime.task_gc), both undone when the task ends; and end to end, what the task
processes of a real run (local launcher) report from inside a map function."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from runtime import Dataflow, GraphError
from runtime.api.testing import run_local
from runtime.config import JobConfig
from runtime.sources import GeneratorSource
from runtime.task_gc import task_gc


@pytest.fixture(autouse=True)
def _pythons_settings() -> Iterator[None]:
    """Every test starts from, and leaves, the collector as pytest had it."""
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_the_threshold_is_set_for_the_body_and_restored_after() -> None:
    gc.set_threshold(700, 11, 12)
    with task_gc(50_000):
        assert gc.get_threshold() == (50_000, 11, 12)
    assert gc.get_threshold() == (700, 11, 12)


def test_what_exists_before_the_body_is_frozen_and_unfrozen_after() -> None:
    built = [object() for _ in range(3)]  # a container: tracked by the collector
    assert gc.is_tracked(built)
    with task_gc(50_000):
        frozen = gc.get_freeze_count()
        assert frozen > 0
        assert not any(built is o for o in gc.get_objects())  # out of every generation
        made_inside = [object()]
        assert any(made_inside is o for o in gc.get_objects(generation=0))
    assert gc.get_freeze_count() == 0
    assert any(built is o for o in gc.get_objects())


def test_cyclic_garbage_made_in_the_body_is_still_collected() -> None:
    class Node:
        def __init__(self) -> None:
            self.me = self

    with task_gc(50_000):
        gc.collect()
        for _ in range(100):
            Node()
        assert gc.collect() >= 100  # each Node and its __dict__


def test_the_settings_are_restored_when_the_body_raises() -> None:
    before = gc.get_threshold()
    with pytest.raises(ValueError), task_gc(50_000):
        raise ValueError("task failed")
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_none_leaves_pythons_collector_alone() -> None:
    before = gc.get_threshold()
    with task_gc(None):
        assert gc.get_threshold() == before and gc.get_freeze_count() == 0


@pytest.mark.parametrize("bad", [0, -5, 1.5, "50000", True])
def test_a_bad_threshold_is_refused_with_the_fix(bad: Any) -> None:
    with pytest.raises(GraphError, match=r"gc_threshold must be a whole number .* or None"):
        JobConfig(gc_threshold=bad)


def _collectors(**config: Any) -> set[tuple[int, bool]]:
    """(young threshold, anything frozen) as every task process of a 2 x 2 keyed job saw
    it while processing its records."""

    def seen() -> list[Any]:
        return [gc.get_threshold()[0], gc.get_freeze_count() > 0]

    flow = Dataflow("collectors", parallelism=2, **config)
    (
        flow.source(GeneratorSource(lambda i: i % 10, 400), name="numbers")
        .map(lambda x: (x, seen()), name="at_source")
        .key_by(lambda r: r[0])
        .map(lambda r: [r[1], seen()], name="at_keyed")
        .collect("out")
    )
    out = run_local(flow, progress=False, ui=False).output("out")
    assert len(out) == 400
    return {(threshold, frozen) for pair in out for threshold, frozen in pair}


@pytest.mark.harness
def test_task_processes_run_with_the_raised_threshold_and_a_frozen_start() -> None:
    assert _collectors() == {(JobConfig().gc_threshold, True)}
    assert _collectors(gc_threshold=12_345) == {(12_345, True)}


@pytest.mark.harness
def test_with_none_they_run_with_pythons_own_settings() -> None:
    # The companion: the check above fails when the mechanism is off. Python's own
    # threshold is a fresh interpreter's (this process's may have been changed).
    fresh = subprocess.run(
        [sys.executable, "-c", "import gc; print(gc.get_threshold()[0])"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert _collectors(gc_threshold=None) == {(int(fresh.stdout), False)}
