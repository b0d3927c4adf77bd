"""An iteration is planned as a loop of the streaming graph: the same graph checks, the
same back-edge search, and the worker's marker sources and peers come from that plan."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.graph import StepKind
from runtime.iterations import IterationError
from runtime.iterations.library import ConnectedComponentsStep
from runtime.iterations.loop_plan import LoopChannels, iteration_plan
from runtime.plan import find_back_edges
from tests.iterations.graphs import components


def test_explain_shows_the_loop_head_the_step_and_the_feedback_back_edges(capsys: Any) -> None:
    text = components(parallelism=3).explain()
    assert "iterate 'components' -> flat_map 'connected_components:step'" in text
    assert "hash -> 'components' (3 channels per subtask)  [back-edge:" in text
    assert "source 'components:input'" in text and "sink 'components:result'" in text
    assert text in capsys.readouterr().out


@pytest.mark.parametrize("parallelism", [1, 2, 4])
def test_the_plan_has_one_feedback_edge_whose_back_edges_make_it_acyclic(
    parallelism: int,
) -> None:
    plan = iteration_plan(components(parallelism=parallelism).spec)
    back = {c.id for c in plan.channels if c.back_edge}
    assert back, "the iteration's feedback edge must close a cycle"
    sources = [t.index for t in plan.source_tasks]
    assert back == find_back_edges(plan.tasks, plan.channels, sources)
    kept = [c for c in plan.channels if not c.back_edge]
    assert not find_back_edges(plan.tasks, kept, sources), "without them: a DAG"
    heads = [c for c in plan.chains if plan.steps[c.step_ids[0]].kind is StepKind.ITERATE]
    assert len(heads) == 1 and len(heads[0].step_ids) == 2  # head and step: one task


def test_each_task_waits_for_markers_from_every_partition_and_sends_to_the_others() -> None:
    plan = iteration_plan(components(parallelism=4).spec)
    for i in range(4):
        loop = LoopChannels.of(plan, i)
        assert loop.marker_sources == (0, 1, 2, 3)
        assert loop.peers == tuple(j for j in range(4) if j != i)
    assert sum(LoopChannels.of(plan, i).back_edges for i in range(4)) == sum(
        c.back_edge for c in plan.channels
    )


class _Bracketed(ConnectedComponentsStep):
    name = "cc[1]"


def test_a_step_name_the_plan_cannot_use_is_rejected_at_build_time() -> None:
    with pytest.raises(IterationError, match=r"iteration 'components' \(step 'cc\[1\]'\).*'\['"):
        components(step=_Bracketed())
