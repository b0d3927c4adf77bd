"""Stable step ids: state saved under a made-up name (``aggregate``, ``aggregate_2``)
restores into the same step after stateless steps were inserted, and is refused, never
loaded into another step, when a stateful step was inserted before it. The companion
tests show that matching by name and kind alone would have moved the state."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from runtime.api.dataflow import Dataflow, Stream
from runtime.plan import JobPlan
from runtime.sources import GeneratorSource
from statebackend import (
    CheckpointMetadata,
    IncompatibleCheckpointError,
    OperatorLayout,
    RestoreTarget,
    TaskStateHandle,
    check_compatible,
    plan_restore,
)
from statebackend.metrics import CheckpointSummary


def ident(x: Any) -> Any:
    return x


def add(n: int, _x: Any) -> int:
    return n + 1


def longest(a: Any, b: Any) -> Any:
    return a if len(str(a)) >= len(str(b)) else b


def job(
    middle: Callable[[Stream], Stream] = ident, pin: str | None = None, source: str | None = None
) -> JobPlan:
    """source -> [middle] -> key_by -> aggregate -> collect 'out' (unnamed unless ``pin``,
    ``source``)."""
    flow = Dataflow("clicks", parallelism=2)
    events = middle(flow.source(GeneratorSource(ident, 10), name=source))
    events.key_by(ident).aggregate(0, add, name=pin).collect("out")
    return flow.plan()


def checkpoint_of(plan: JobPlan) -> CheckpointMetadata:
    """A checkpoint holding state of every stateful step of ``plan`` (one file per task)."""
    tasks = {}
    for t in plan.tasks:
        ops = {}
        for s in plan.chain_steps(t):
            keyed = (0, 128) if s.kind.keyed else None
            ops[s.name] = OperatorLayout(t.subtask, s.parallelism, keyed)
        tasks[t.task_id] = TaskStateHandle(f"{t.task_id}.state", 1, 1, ops)
    return CheckpointMetadata(
        checkpoint_id=3,
        job=plan.name,
        attempt=0,
        final=True,
        trigger_time=0.0,
        completed_time=1.0,
        duration_ms=1.0,
        max_parallelism=plan.max_parallelism,
        tasks=tasks,
        task_metrics={},
        metrics=CheckpointSummary(),
        steps=tuple(s for s in plan.step_states() if s.kind != "map"),
    )


def restored_into(old: JobPlan, new: JobPlan, by_name_only: bool = False) -> dict[str, str]:
    """Which step of ``new`` gets the state each aggregate step of ``old`` saved (by the
    step's function, which identifies it across the two graphs)."""
    metadata = checkpoint_of(old)
    states = new.step_states()
    if by_name_only:  # the behaviour before signatures: name and kind only
        metadata = dataclasses.replace(
            metadata, steps=tuple(dataclasses.replace(s, signature="") for s in metadata.steps)
        )
        states = tuple(dataclasses.replace(s, signature="") for s in states)
    check_compatible(metadata, states, new.name, new.max_parallelism)
    by_name = {s.name: s for s in states}
    targets = [RestoreTarget(by_name[s.name], range(0, 128)) for s in new.steps if s.kind.keyed]
    plan = plan_restore(metadata, 0, targets)
    old_fn = {s.name: s.fn for s in old.steps}
    new_fn = {s.name: s.fn for s in new.steps}
    return {
        old_fn[name].__name__: new_fn[name].__name__
        for name, op in plan.operators.items()
        if op.keyed_state
    }


def test_inserting_stateless_steps_keeps_every_auto_name_and_signature() -> None:
    old = job()
    for middle in (
        lambda s: s.map(ident),
        lambda s: s.map(ident, name="normalize").filter(bool, name="valid"),
        lambda s: s.rebalance().flat_map(lambda x: [x]),
    ):
        new = job(middle)
        assert {s.name: s.signature for s in new.steps if s.kind.keyed} == {
            s.name: s.signature for s in old.steps if s.kind.keyed
        }
        assert restored_into(old, new) == {"add": "add"}


def two_aggregates(s: Stream) -> Stream:
    """A new stateful step of the same kind before the old one: takes its auto-name."""
    return s.key_by(ident).aggregate(0, longest).map(ident)


def test_inserting_a_stateful_step_before_is_refused_naming_the_step_and_the_fix() -> None:
    old, new = job(), job(two_aggregates)
    assert [s.name for s in new.steps if s.kind.keyed] == ["aggregate", "aggregate_2"]
    with pytest.raises(IncompatibleCheckpointError) as info:
        restored_into(old, new)
    message = str(info.value)
    assert "step 'aggregate'" in message and "name='aggregate'" in message
    assert "another position of the graph" in message


def test_companion_by_name_and_kind_alone_the_state_moves_into_the_inserted_step() -> None:
    """Without signatures the old aggregate's state ('add') loads into the new one."""
    assert restored_into(job(), job(two_aggregates), by_name_only=True) == {"add": "longest"}


def test_pinning_the_old_names_restores_into_the_right_steps() -> None:
    """The fix the error names. The unnamed source is refused too: a stateful step was
    inserted downstream of it, so its position changed as well."""

    def inserted(s: Stream) -> Stream:
        return s.key_by(ident).aggregate(0, longest, name="longest").map(ident)

    with pytest.raises(IncompatibleCheckpointError, match="name='generator'"):
        restored_into(job(), job(inserted, pin="aggregate"))
    assert restored_into(job(), job(inserted, pin="aggregate", source="generator")) == {
        "add": "add"
    }


def test_steps_in_the_same_position_get_distinct_signatures() -> None:
    flow = Dataflow("twins", parallelism=1)
    a = flow.source(GeneratorSource(ident, 3))
    b = flow.source(GeneratorSource(ident, 3))
    a.union(b).collect("out")
    sources = [s for s in flow.plan().steps if s.kind.value == "source"]
    assert [s.name for s in sources] == ["generator", "generator_2"]
    assert len({s.signature for s in sources}) == 2 and all(s.signature for s in sources)


def test_named_steps_have_no_signature_and_restore_by_name() -> None:
    plan = job(pin="per_user", source="events")
    (agg,) = [s for s in plan.steps if s.kind.keyed]
    assert agg.name == "per_user" and not agg.auto and agg.signature == ""
    new = job(two_aggregates, pin="per_user", source="events")
    assert restored_into(plan, new) == {"add": "add"}
