"""The iteration front (``runtime.api.iterations``; ``runtime.iterations`` for users):
what is checked at build time, before any task starts, and the compensation functions.
What only the run can see is in test_supersteps (on the harness)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from runtime.errors import GraphError
from runtime.iterations import (
    BulkIteration,
    DeltaIteration,
    IterationError,
    Recovery,
    l1_below,
)
from runtime.iterations.library import (
    ConnectedComponentsStep,
    PageRankStep,
)

RANKS = {v: 0.25 for v in range(4)}
OUT = {0: (1, 2), 1: (2,), 2: (0,), 3: ()}


def test_bulk_iteration_that_cannot_end_is_rejected_at_build_time() -> None:
    with pytest.raises(
        IterationError, match=r"'pr' \(step 'pagerank'\) can never end.*max_supersteps"
    ):
        BulkIteration("pr", RANKS, PageRankStep(4), side=OUT)


def test_either_criterion_is_enough() -> None:
    BulkIteration("pr", RANKS, PageRankStep(4), side=OUT, max_supersteps=3)
    BulkIteration("pr", RANKS, PageRankStep(4), side=OUT, converged=l1_below(1e-6))


def test_a_side_input_that_is_not_a_mapping_is_rejected() -> None:
    with pytest.raises(IterationError, match=r"side input must be a mapping .* not list"):
        BulkIteration("pr", RANKS, PageRankStep(4), side=[(0, (1,))], max_supersteps=3)  # type: ignore[arg-type]


def test_workset_must_name_solution_keys() -> None:
    with pytest.raises(IterationError, match="workset holds keys the solution set does not have"):
        DeltaIteration("cc", {0: 0}, ConnectedComponentsStep(), workset=[0, 9])


@pytest.mark.parametrize("bad", [0, -1])
def test_parallelism_and_max_supersteps_must_be_positive(bad: int) -> None:
    with pytest.raises(IterationError, match="parallelism must be at least 1"):
        BulkIteration("pr", RANKS, PageRankStep(4), parallelism=bad, max_supersteps=3)
    with pytest.raises(IterationError, match="max_supersteps must be at least 1"):
        BulkIteration("pr", RANKS, PageRankStep(4), max_supersteps=bad)


def test_recovery_settings_are_checked_before_any_task_starts() -> None:
    it = BulkIteration("pr", RANKS, PageRankStep(4), side=OUT, max_supersteps=3)
    # The launcher named does not exist: reaching it would fail another way.
    with pytest.raises(IterationError, match="optimistic recovery needs a compensation function"):
        it.run(recovery=Recovery("optimistic"), launcher="nowhere")
    with pytest.raises(IterationError, match="recovery mode 'lazy'"):
        it.run(recovery=Recovery("lazy"), launcher="nowhere")  # type: ignore[arg-type]
    with pytest.raises(IterationError, match="checkpoint interval must be at least 1"):
        it.run(recovery=Recovery("blocking", interval=0), launcher="nowhere")


def test_unpicklable_step_is_rejected() -> None:
    step = PageRankStep(4)
    step.lock = threading.Lock()  # type: ignore[attr-defined]  # no pickler takes a lock
    with pytest.raises(GraphError, match=r"pagerank:superstep.*step.*pickl"):
        BulkIteration("pr", RANKS, step, side=OUT, max_supersteps=3)


def test_explain_shows_the_loop_head_the_superstep_and_the_feedback(capsys: Any) -> None:
    it = DeltaIteration("cc", {v: v for v in range(4)}, ConnectedComponentsStep(), side=OUT)
    text = it.explain()
    assert text in capsys.readouterr().out
    for part in ("cc:solution-input", "connected_components:superstep", "cc:result"):
        assert part in text, text
    assert "feedback" in text.lower() or "back" in text.lower(), text
