"""Iterations end to end on real ZeroMQ sockets, tasks as driver threads (no Spark): a
"kill" ends a task's thread abruptly. Failures, both recovery styles, the companions
that show compensation and the rescue read matter, and a slow task."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from jobmanager.iteration_result import IterationResult
from runtime.iterations import IterationError, Recovery
from runtime.iterations.graphs import union_find_labels
from runtime.iterations.library import (
    ConnectedComponentsStep,
    PageRankStep,
    cc_compensation,
    cc_without_compensation,
    pagerank_compensation,
    pagerank_without_compensation,
)
from tests.iterations.graphs import CC_EDGES, N_CC, components, networkx_ranks, pagerank

CC_REF = union_find_labels(N_CC, CC_EDGES)
KILL_AT = 4


def _max_diff(a: dict[Any, float], b: dict[Any, float]) -> float:
    return max(abs(a[k] - b[k]) for k in b)


def test_failure_free_runs_match_the_references() -> None:
    ranks = pagerank().run(launcher="threads")
    assert ranks.converged and ranks.attempts == 1
    assert _max_diff(ranks.solution, networkx_ranks()) < 1e-8
    cc = components().run(launcher="threads")
    assert cc.converged and cc.solution == CC_REF


RECOVERIES = {
    "none": (Recovery("none"), "start", KILL_AT),
    "optimistic": (Recovery("optimistic", compensation=cc_compensation), "optimistic", 1),
    "blocking": (Recovery("blocking", interval=2), "checkpoint", KILL_AT - 2),  # chk 2
    "tail": (Recovery("tail", interval=3), "checkpoint", KILL_AT - 3),  # chk 3
    "head": (Recovery("head", interval=1), "checkpoint", 2),  # chk 2 written during 3
}


@pytest.mark.parametrize("mode", list(RECOVERIES))
def test_kill_at_superstep_k_under_each_recovery_style(mode: str) -> None:
    recovery, kind, rerun = RECOVERIES[mode]
    result = components().run(recovery=recovery, kills=[(1, KILL_AT)], launcher="threads")
    assert result.solution == CC_REF
    assert result.attempts == 2
    (rec,) = result.recoveries
    assert (rec.failed_during, rec.kind, rec.rerun) == (KILL_AT, kind, rerun)
    if kind == "optimistic":
        assert rec.lost_partitions == (1,)


def test_pagerank_after_optimistic_recovery_is_within_1e_4_of_the_failure_free_ranks() -> None:
    clean = pagerank().run(launcher="threads")
    recovered = pagerank().run(
        recovery=Recovery("optimistic", compensation=pagerank_compensation),
        kills=[(2, 6)],
        launcher="threads",
    )
    (rec,) = recovered.recoveries
    assert rec.kind == "optimistic" and rec.mass_after == pytest.approx(1.0, abs=1e-9)
    assert recovered.converged
    assert _max_diff(recovered.solution, clean.solution) < 1e-4
    assert sum(recovered.solution.values()) == pytest.approx(1.0, abs=1e-9)


def test_companion_without_compensation_pagerank_loses_rank_mass() -> None:
    kw: dict[str, Any] = {"kills": [(2, 6)], "launcher": "threads"}
    fixed = pagerank(max_supersteps=9, tol=0.0)  # a fixed budget: no time to heal
    good = fixed.run(recovery=Recovery("optimistic", compensation=pagerank_compensation), **kw)
    bad = fixed.run(
        recovery=Recovery("optimistic", compensation=pagerank_without_compensation), **kw
    )
    clean = fixed.run(launcher="threads")
    assert good.recoveries[0].mass_after == pytest.approx(1.0, abs=1e-9)
    assert bad.recoveries[0].mass_after is not None and bad.recoveries[0].mass_after < 0.9
    assert abs(sum(bad.solution.values()) - 1.0) > 1e-3
    assert _max_diff(bad.solution, clean.solution) > 10 * _max_diff(good.solution, clean.solution)


def test_companion_without_compensation_cc_labels_are_wrong() -> None:
    kw: dict[str, Any] = {"kills": [(0, 6)], "launcher": "threads"}
    good = components().run(recovery=Recovery("optimistic", compensation=cc_compensation), **kw)
    bad = components().run(
        recovery=Recovery("optimistic", compensation=cc_without_compensation), **kw
    )
    assert good.solution == CC_REF
    wrong = [v for v in CC_REF if bad.solution[v] != CC_REF[v]]
    assert wrong, "without re-activating the neighbours, lost vertices keep their own id"


def test_survivors_partitions_are_reused() -> None:
    kw: dict[str, Any] = {"kills": [(1, 6)], "launcher": "threads"}
    optimistic = pagerank().run(
        recovery=Recovery("optimistic", compensation=pagerank_compensation), **kw
    )
    restart = pagerank().run(recovery=Recovery("none"), **kw)
    assert optimistic.recoveries[0].rerun == 1
    assert restart.recoveries[0].rerun == 6
    assert optimistic.supersteps_started < restart.supersteps_started


def test_optimistic_falls_back_when_too_much_is_lost_and_says_so() -> None:
    recovery = Recovery("optimistic", compensation=cc_compensation, max_lost_fraction=0.0)
    result = components().run(recovery=recovery, kills=[(1, KILL_AT)], launcher="threads")
    (rec,) = result.recoveries
    assert rec.kind == "start" and "falling back to the start" in rec.note
    assert "note: 1 of 3 partitions lost" in result.summary()
    assert result.solution == CC_REF


def _wrong_keys(surviving: dict[Any, Any], lost: frozenset[Any], side: Any) -> Any:
    return {k + 100000: 0.0 for k in lost}


def test_compensation_returning_wrong_keys_is_an_error_naming_it() -> None:
    recovery = Recovery("optimistic", compensation=_wrong_keys)
    with pytest.raises(
        IterationError,
        match=r"step 'pagerank'.*compensation '_wrong_keys' must return exactly the lost keys",
    ):
        pagerank().run(recovery=recovery, kills=[(1, 3)], launcher="threads")


class _Escaping(ConnectedComponentsStep):
    name = "escaping_cc"

    def messages(self, key: Any, value: int, side: Any) -> Any:
        return [(key + 10**6, value)]


def test_a_step_that_changes_the_key_set_fails_the_run_naming_the_step() -> None:
    with pytest.raises(IterationError, match=r"step 'escaping_cc'.*may not change the key set"):
        components(step=_Escaping()).run(recovery=Recovery("none"), launcher="threads")


def test_superstep_barriers_wait_for_a_slow_task_without_deadlock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Partition 0 updates each superstep only after every other partition has updated
    it (it is the slowest, by construction, not by a sleep): no task may start superstep
    k + 1 before partition 0's update of k is over. The order is read from one event
    log of the in-process tasks (launcher="threads"), not from a clock."""
    from runtime.iterations import worker
    from runtime.iterations.partition import PartitionCompute

    log: list[tuple[str, int, int]] = []  # ("start" | "updated", partition, superstep)
    cond = threading.Condition()
    superstep_of: dict[int, int] = {}  # partition -> the superstep its thread is in
    run_superstep, update = worker._Head._superstep, PartitionCompute.update

    def logged_superstep(self: Any, k: int) -> None:
        with cond:
            superstep_of[self.wctx.index] = k
            log.append(("start", self.wctx.index, k))
        run_superstep(self, k)

    def slowest_update(self: Any, total: float, sink: Any = None) -> Any:
        k = superstep_of[self.index]
        if self.index == 0:  # wait until every other partition has updated k
            others = range(1, self.spec.parallelism)
            with cond:
                assert cond.wait_for(
                    lambda: all(("updated", j, k) in log for j in others), timeout=60
                ), f"partitions {sorted(others)} never finished superstep {k}"
        outcome = update(self, total, sink)
        with cond:
            log.append(("updated", self.index, k))
            cond.notify_all()
        return outcome

    monkeypatch.setattr(worker._Head, "_superstep", logged_superstep)
    monkeypatch.setattr(PartitionCompute, "update", slowest_update)
    result: IterationResult = components().run(launcher="threads")
    assert result.solution == CC_REF and result.attempts == 1
    p = len({i for _, i, _ in log})
    assert p > 1 and result.supersteps > 1
    for k in range(1, result.supersteps):
        slow_done = log.index(("updated", 0, k))
        # partition 0 was the last to update k: the others had to wait for it ...
        assert all(log.index(("updated", j, k)) < slow_done for j in range(1, p))
        # ... and none started k + 1 before it was done
        assert all(log.index(("start", j, k + 1)) > slow_done for j in range(p))


def test_optimistic_falls_back_to_its_fallback_checkpoints() -> None:
    recovery = Recovery(
        "optimistic",
        compensation=cc_compensation,
        max_lost_fraction=0.0,
        fallback="blocking",
        interval=2,
    )
    result = components().run(recovery=recovery, kills=[(1, KILL_AT + 1)], launcher="threads")
    (rec,) = result.recoveries
    assert (rec.kind, rec.resumed_from) == ("checkpoint", KILL_AT)
    assert "falling back to the last superstep checkpoint" in rec.note
    assert result.solution == CC_REF


_rescue_over = threading.Event()


class _BusyPageRank(PageRankStep):
    """Vertex 0's task is stuck in the send phase of superstep 2 (its second) until the
    job manager's rescue read is over: it cannot answer the rescue read in time."""

    name = "busy_pagerank"
    calls = 0

    def messages(self, key: Any, value: float, side: Any) -> Any:
        if key == 0:
            type(self).calls += 1
            if type(self).calls == 2:
                assert _rescue_over.wait(60), "the rescue read never ended"
        return super().messages(key, value, side)


def test_a_survivor_that_cannot_answer_the_rescue_read_in_time_counts_as_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jobmanager.iteration_attempt import IterationAttempt
    from runtime.iterations import BulkIteration
    from runtime.iterations.graphs import adjacency
    from tests.iterations.graphs import N_PR, PR_EDGES

    rescue = IterationAttempt.rescue
    rescued: list[dict[int, bytes]] = []

    def rescue_then_release(self: Any, superstep: int, timeout: float) -> dict[int, bytes]:
        try:
            rescued.append(rescue(self, superstep, timeout))
            return rescued[-1]
        finally:
            _rescue_over.set()

    monkeypatch.setattr(IterationAttempt, "rescue", rescue_then_release)
    monkeypatch.setattr(_BusyPageRank, "calls", 0)
    _rescue_over.clear()
    it = BulkIteration(
        "busy",
        {v: 1.0 / N_PR for v in range(N_PR)},
        _BusyPageRank(N_PR),
        side=adjacency(N_PR, PR_EDGES),
        parallelism=3,
        max_supersteps=3,
    )
    # partition 2 answers within the time-out, partition 0 (busy) cannot, 1 is killed
    recovery = Recovery("optimistic", compensation=pagerank_compensation, rescue_timeout=1.0)
    try:
        result = it.run(recovery=recovery, kills=[(1, 2)], launcher="threads")
    finally:
        _rescue_over.set()
    assert [sorted(r) for r in rescued] == [[2]]
    (rec,) = result.recoveries
    assert rec.kind == "start" and rec.lost_partitions == (0, 1)
    assert rec.note == (
        "2 of 3 partitions lost: more than compensation should rebuild; falling back to the start"
    )
    assert result.supersteps == 3 and sum(result.solution.values()) == pytest.approx(1.0)


def test_a_lost_message_is_caught_by_the_superstep_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime.iterations import worker

    absorb = worker._Head._absorb
    dropped: list[int] = []

    def lossy(self: Any, flat: Any) -> None:
        if flat and not dropped:  # lose one batch of messages, once
            dropped.append(len(flat) // 2)
            return
        absorb(self, flat)

    monkeypatch.setattr(worker._Head, "_absorb", lossy)
    with pytest.raises(IterationError, match=r"superstep 1 is not balanced"):
        components().run(launcher="threads")
    assert dropped and dropped[0] > 0


def test_companion_without_the_counts_a_lost_message_gives_wrong_components(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same loss with the check switched off (every wave counts as balanced): the
    run ends "converged" with wrong labels, which is what the balanced wave prevents."""
    from jobmanager import iteration_attempt
    from jobmanager.termination import Wave
    from runtime.iterations import worker

    absorb = worker._Head._absorb
    dropped: list[int] = []

    def lossy(self: Any, flat: Any) -> None:
        if flat and not dropped:
            dropped.append(len(flat) // 2)
            return
        absorb(self, flat)

    class Unchecked(Wave):
        @property
        def balanced(self) -> bool:
            return True

    monkeypatch.setattr(worker._Head, "_absorb", lossy)
    monkeypatch.setattr(iteration_attempt, "Wave", Unchecked)
    result = components().run(launcher="threads")
    assert result.converged and result.solution != CC_REF
