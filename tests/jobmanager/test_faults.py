"""Faults as data: ``resolve_faults`` checks each against the plan and splits them into
driver kills and task faults; ``relative_to_run`` shifts task faults' checkpoint ids."""

from __future__ import annotations

import signal

import pytest

from jobmanager.faults import (
    DriverKill,
    Kill,
    RaiseAt,
    RandomKills,
    relative_to_run,
    resolve_faults,
)
from runtime.errors import GraphError
from runtime.task_environment import FaultKind, TaskFault
from tests.jobmanager.fakes import small_plan


def test_random_kills_pick_the_same_tasks_for_a_seed() -> None:
    plan = small_plan()
    kills, _ = resolve_faults(plan, [RandomKills(5, seed=7)])
    again, _ = resolve_faults(plan, [RandomKills(5, seed=7)])
    assert [k.task_index for k in kills] == [k.task_index for k in again]
    assert [k.after_seconds for k in kills] == [k.after_seconds for k in again]
    assert all(k.attempt is None for k in kills)
    assert all(0.0 <= (k.after_seconds or 0) <= 0.5 for k in kills)
    assert kills[0].label.startswith("random kill 1 of 5 (")
    with pytest.raises(GraphError):
        resolve_faults(plan, [RandomKills(1, min_seconds=2.0, max_seconds=1.0)])


def test_explicit_kills_are_labelled_as_written() -> None:
    kills, _ = resolve_faults(small_plan(), [Kill("count[1]", after_checkpoint=3, attempt=1)])
    assert kills == [
        DriverKill(3, 1, None, 3, label="Kill('count[1]', after_checkpoint=3, attempt=1)")
    ]


def test_task_faults_count_checkpoints_from_the_runs_first() -> None:
    faults = [
        TaskFault(FaultKind.KILL_DURING_SNAPSHOT, 2, 0, 2),
        TaskFault(FaultKind.RAISE_AT_RECORD, 1, 0),
    ]
    assert relative_to_run(faults, 1) == faults
    shifted = relative_to_run(faults, 41)
    assert shifted[0].checkpoint_id == 42 and shifted[1].checkpoint_id is None


def test_a_superstep_kill_needs_an_iteration() -> None:
    with pytest.raises(GraphError, match="is no iteration"):
        resolve_faults(small_plan(), [Kill("src[0]", after_superstep=2)])


def test_a_kill_during_a_moment_is_a_task_fault_from_its_first_checkpoint() -> None:
    driver, task = resolve_faults(
        small_plan(),
        [
            Kill("count[1]", during="alignment", attempt=1),
            Kill("out[0]", during="snapshot", after_checkpoint=3),  # a chained step names its task
        ],
    )
    assert driver == []
    assert task == [
        TaskFault(FaultKind.KILL_DURING_ALIGNMENT, 3, 1, 1),
        TaskFault(FaultKind.KILL_DURING_SNAPSHOT, 2, 0, 3),
    ]


def test_raise_at_goes_to_the_task_whose_chain_holds_the_step() -> None:
    driver, task = resolve_faults(small_plan(), [RaiseAt("out", record=7, subtask=1, attempt=2)])
    assert driver == []
    assert task == [TaskFault(FaultKind.RAISE_AT_RECORD, 3, 2, operator="out", record=7)]


def test_a_sigstop_kill_keeps_its_signal_and_says_so_in_its_label() -> None:
    (stop,), _ = resolve_faults(
        small_plan(), [Kill("src[1]", after_seconds=1.5, signal=signal.SIGSTOP)]
    )
    assert stop == DriverKill(
        1,
        0,
        1.5,
        None,
        signal.SIGSTOP,
        label="Kill('src[1]', after_seconds=1.5, SIGSTOP, attempt=0)",
    )


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        (Kill("count[0]"), r"Kill\('count\[0\]'\) needs after_seconds, after_checkpoint"),
        (Kill("count[9]", after_seconds=1.0), r"'count\[9\]'.*parallelism 2, subtasks are 0..1"),
        (Kill("count[0]", during="lunch"), r"during='lunch'\): use one of 'alignment', 'snapshot'"),
        (Kill("src[0]", during="alignment"), "has 0 input channel.*alignment needs at least 2"),
        (Kill("count[0]", during="backedge_log"), r"no back-edge input \(it is no loop head\)"),
        (Kill("src[0]", during="compaction"), r"holds no keyed state, so it never compacts"),
        (
            Kill("count[0]", during="snapshot", signal=signal.SIGSTOP),
            "always sends SIGKILL; drop signal=",
        ),
        (RaiseAt("nope", record=1), "RaiseAt: no step 'nope' with subtask 0"),
        (RaiseAt("count", record=1, subtask=2), "no step 'count' with subtask 2"),
        ("kill it", "unknown fault 'kill it': use Kill, RaiseAt or RandomKills"),
    ],
)
def test_a_fault_the_plan_cannot_take_is_refused_with_the_fix(fault: object, message: str) -> None:
    with pytest.raises(GraphError, match=message):
        resolve_faults(small_plan(), [fault])
