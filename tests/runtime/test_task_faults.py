"""Faults a task injects into itself (runtime/task_faults.py): which of the attempt's
faults are this task's, when each fires, and the raise at record k. The kills themselves
(a real SIGKILL) are exercised by the fault-injection pipelines; here ``_die`` raises."""

from __future__ import annotations

from typing import Any

import pytest

from runtime import task_faults
from runtime.api.dataflow import Dataflow
from runtime.operators import Operator, build_operator
from runtime.sources import CollectionSource
from runtime.task_environment import FaultKind, TaskFault
from runtime.task_faults import InjectedFailure, RaiseAtRecord, TaskFaults
from tests.runtime.barriers.scripts import FakeClock, RecordingActions, aligner, barrier

ALIGN, SNAP, LOG = (
    FaultKind.KILL_DURING_ALIGNMENT,
    FaultKind.KILL_DURING_SNAPSHOT,
    FaultKind.KILL_DURING_BACKEDGE_LOG,
)


class Died(Exception):
    pass


@pytest.fixture(autouse=True)
def no_sigkill(monkeypatch: pytest.MonkeyPatch) -> None:
    def die() -> None:
        raise Died

    monkeypatch.setattr(task_faults, "_die", die)


def double_op() -> Operator:
    flow = Dataflow("f")
    flow.source(CollectionSource([1]), name="src").map(lambda x: 2 * x, name="double").collect()
    step = next(s for s in flow.plan().steps if s.name == "double")
    return build_operator(step, 0, 128)


def test_only_this_tasks_faults_of_this_attempt_count() -> None:
    faults = [
        TaskFault(SNAP, task_index=1, attempt=0, checkpoint_id=2),
        TaskFault(SNAP, task_index=2, attempt=0, checkpoint_id=1),
        TaskFault(SNAP, task_index=1, attempt=1, checkpoint_id=1),
    ]
    mine = TaskFaults(faults, task_index=1, attempt=0)
    assert [mine.kill_during_snapshot(n) for n in (1, 2, 3)] == [False, True, True]
    assert TaskFaults(faults, task_index=1, attempt=1).kill_during_snapshot(1)
    assert not TaskFaults(faults, task_index=3, attempt=0).kill_during_snapshot(99)


def test_a_kill_without_a_checkpoint_fires_at_the_first() -> None:
    assert TaskFaults([TaskFault(SNAP, 0)], 0, 0).kill_during_snapshot(1)


def test_the_back_edge_kill_fires_from_its_checkpoint_on() -> None:
    faults = TaskFaults([TaskFault(LOG, 0, checkpoint_id=3)], 0, 0)
    faults.while_logging(2)
    with pytest.raises(Died):
        faults.while_logging(3)
    TaskFaults([TaskFault(SNAP, 0)], 0, 0).while_logging(5)  # another kind: no kill


def test_the_alignment_kill_fires_only_when_an_alignment_starts() -> None:
    faults = TaskFaults([TaskFault(ALIGN, 0, checkpoint_id=2)], 0, 0)
    two_inputs = aligner([0, 1], RecordingActions(), FakeClock())
    faults.before_barrier(two_inputs, 1)  # before its checkpoint
    two_inputs.on_barrier(0, barrier(1))
    two_inputs.on_barrier(1, barrier(1))
    one_input = aligner([0], RecordingActions(), FakeClock())
    faults.before_barrier(one_input, 2)  # one live input: nothing to align
    with pytest.raises(Died):
        faults.before_barrier(two_inputs, 2)
    two_inputs.on_barrier(0, barrier(2))
    two_inputs.on_barrier(1, barrier(2))
    faults.before_barrier(two_inputs, 2)  # a later barrier of a checkpoint already seen


def test_raise_at_record_wraps_only_its_step_and_raises_at_record_k() -> None:
    op = double_op()
    assert (
        TaskFaults(
            [TaskFault(FaultKind.RAISE_AT_RECORD, 0, operator="other", record=1)], 0, 0
        ).wrap(op)
        is op
    )
    faults = TaskFaults(
        [TaskFault(FaultKind.RAISE_AT_RECORD, 0, operator="double", record=5)], 0, 0
    )
    wrapped: Any = faults.wrap(op)
    assert isinstance(wrapped, RaiseAtRecord) and wrapped.name == "double"
    assert wrapped.process([1, 2]) == [2, 4]
    assert wrapped.process([3, 4]) == [6, 8]
    with pytest.raises(InjectedFailure, match="injected failure at record 5 of 'double'"):
        wrapped.process([5])
    assert wrapped.seen == 4
