"""Iterations without sockets: build-time checks, the per-partition superstep logic,
the wire formats, superstep checkpoint files, the compensation functions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from channels import messages as M
from runtime import control as P
from runtime import superstep_control as S
from runtime.iterations import (
    BulkIteration,
    DeltaIteration,
    IterationError,
    KeyPartitioner,
    Partitioned,
    Recovery,
    l1_below,
)
from runtime.iterations.graphs import union_find_labels
from runtime.iterations.library import (
    ConnectedComponentsStep,
    PageRankStep,
    cc_compensation,
    pagerank_compensation,
)
from runtime.iterations.partition import PartitionCompute, decode_state, encode_state
from runtime.iterations.snapshots import PartWriter, SuperstepStore, write_whole

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


def test_side_input_partitioned_differently_is_rejected() -> None:
    other = Partitioned(tuple(KeyPartitioner(3).split(OUT)), KeyPartitioner(3))
    with pytest.raises(
        IterationError, match=r"step 'pagerank'.*partitioned by .*3.*iteration state by"
    ):
        BulkIteration("pr", RANKS, PageRankStep(4), side=other, parallelism=2, max_supersteps=3)


def test_side_input_with_a_key_in_the_wrong_part_is_rejected() -> None:
    parts = ({1: (2,)}, {0: (1,)})  # key 1 belongs to part 1 under hash(2)
    with pytest.raises(IterationError, match="part 0 holds key 1"):
        BulkIteration(
            "pr",
            RANKS,
            PageRankStep(4),
            side=Partitioned(parts, KeyPartitioner(2)),
            max_supersteps=3,
        )


def test_side_input_split_the_same_way_is_accepted() -> None:
    ok = Partitioned(tuple(KeyPartitioner(2).split(OUT)), KeyPartitioner(2))
    it = BulkIteration("pr", RANKS, PageRankStep(4), side=ok, parallelism=2, max_supersteps=3)
    assert it.side == OUT


def test_workset_must_name_solution_keys() -> None:
    with pytest.raises(IterationError, match="workset holds keys the solution set does not have"):
        DeltaIteration("cc", {0: 0}, ConnectedComponentsStep(), workset=[0, 9])


def test_optimistic_recovery_needs_a_compensation_function() -> None:
    it = BulkIteration("pr", RANKS, PageRankStep(4), side=OUT, max_supersteps=3)
    with pytest.raises(IterationError, match="optimistic recovery needs a compensation function"):
        it.run(recovery=Recovery("optimistic"), launcher="threads")
    with pytest.raises(IterationError, match="recovery mode 'lazy'"):
        it.run(recovery=Recovery("lazy"), launcher="threads")  # type: ignore[arg-type]


def test_unpicklable_step_is_rejected() -> None:
    step = PageRankStep(4)
    step.combine = lambda a, b: a + b  # a lambda in an instance attribute: not picklable
    with pytest.raises(IterationError, match="cannot be pickled"):
        BulkIteration("pr", RANKS, step, side=OUT, max_supersteps=3)


def _superstep(parts: list[PartitionCompute]) -> list[Any]:
    outs = [p.emit() for p in parts]
    total = sum(c for _, c in outs)
    for out, _ in outs:
        for j, flat in enumerate(out):
            parts[j].absorb(list(flat))
    return [p.update(total) for p in parts]


def test_partitions_compute_one_pagerank_superstep_like_the_formula() -> None:
    spec = BulkIteration("pr", RANKS, PageRankStep(4), side=OUT, max_supersteps=3).spec
    split = spec.partitioner.split(RANKS)
    sides = spec.partitioner.split(OUT)
    parts = [PartitionCompute(spec, i, split[i], None, sides[i]) for i in range(2)]
    _superstep(parts)
    new = {**parts[0].proposed()[0], **parts[1].proposed()[0]}
    base, d = 0.15 / 4, 0.85
    dangling = 0.25 / 4  # vertex 3 has no out-edge
    assert new[2] == pytest.approx(base + d * (0.125 + 0.25 + dangling))
    assert new[3] == pytest.approx(base + d * dangling)
    assert sum(new.values()) == pytest.approx(1.0)
    assert parts[0].solution == split[0]  # the committed state is untouched until commit
    parts[0].commit()
    assert parts[0].solution == {k: new[k] for k in split[0]}


def test_delta_partitions_reach_the_components() -> None:
    edges = [(0, 3), (3, 5), (1, 4)]
    adj: dict[int, tuple[int, ...]] = {v: () for v in range(6)}
    for a, b in edges:
        adj[a] += (b,)
        adj[b] += (a,)
    it = DeltaIteration("cc", {v: v for v in range(6)}, ConnectedComponentsStep(), side=adj)
    spec = it.spec
    parts = [
        PartitionCompute(spec, i, s, {k for k in s}, spec.partitioner.split(adj)[i])
        for i, s in enumerate(spec.partitioner.split(it.solution))
    ]
    for _ in range(10):
        if sum(o.active for o in _superstep(parts)) == 0:
            break
        for p in parts:
            p.commit()
    labels = {**parts[0].proposed()[0], **parts[1].proposed()[0]}
    assert labels == union_find_labels(6, edges)


def test_a_message_to_an_unknown_key_names_the_step() -> None:
    spec = BulkIteration("pr", RANKS, PageRankStep(4), side=OUT, max_supersteps=3).spec
    part = PartitionCompute(spec, 0, {0: 0.25, 2: 0.25}, None, {})
    with pytest.raises(
        IterationError, match=r"step 'pagerank'.*key 42.*may not change the key set"
    ):
        part.absorb([42, 0.1])


def test_superstep_marker_and_control_messages_round_trip() -> None:
    frame = M.encode_superstep(3, 17, 0.5)
    assert M.decode_header(frame) == (3, M.KIND_SUPERSTEP)
    assert M.decode_superstep(frame) == (17, 0.5)
    with pytest.raises(M.MalformedFrameError):
        M.decode_superstep(M.encode_data(3, [1]))
    for msg in (
        S.SuperstepDone(1, 0, 4, 0.25, 10, 2, 0.01),
        S.SuperstepGo(5, False),
        S.RescueRequest(4),
        S.PartitionState(1, 0, 4, encode_state({1: 2}, {1})),
        P.Cancel("x"),
    ):
        assert S.decode(P.encode(msg)) == msg


def test_state_and_checkpoint_files_round_trip(tmp_path: Path) -> None:
    assert decode_state(encode_state({1: 0.5, 2: 0.5}, None)) == ({1: 0.5, 2: 0.5}, None)
    store = SuperstepStore(str(tmp_path))
    write_whole(store, 4, 1, {i: i * 2 for i in range(20000)}, {3, 5}, chunk=3000).wait()
    writer = PartWriter(store, 4, 0)
    writer.add([(1, 1)])
    writer.finish(None)
    writer.wait()
    assert store.latest() is None  # no _metadata yet: the superstep does not count
    store.complete(4, 2, attempt=0)
    assert store.latest() == 4
    solution, workset = store.read_part(4, 1)
    assert solution == {i: i * 2 for i in range(20000)} and workset == {3, 5}
    assert store.read_part(4, 0) == ({1: 1}, None)
    write_whole(store, 4, 0, {1: 99}, None, attempt=3).wait()  # a later attempt's part
    assert store.read_part(4, 0) == ({1: 1}, None)  # the metadata names attempt 0
    store.complete(4, 2, attempt=3)
    assert store.read_part(4, 0) == ({1: 99}, None)


def test_compensations_follow_the_seed() -> None:
    surviving = {0: 0.3, 1: 0.2}
    assert pagerank_compensation(surviving, frozenset({2, 3}), {}) == {2: 0.25, 3: 0.25}
    values, workset = cc_compensation({0: 0, 1: 0}, frozenset({2}), {2: (1,), 1: (2, 0)})
    assert values == {2: 2} and workset == {1, 2}


class _Router:
    """Captures what the job manager sends (a stand-in for its ROUTER socket)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []

    def send_multipart(self, frames: list[bytes], flags: int = 0) -> None:
        self.sent.append((frames[0].decode(), S.decode(frames[1])))


class _Running:
    def failure(self) -> str | None:
        return None


def test_the_job_manager_decides_a_superstep_only_when_every_task_reported(tmp_path: Path) -> None:
    from jobmanager.iteration_attempt import IterationAttempt
    from jobmanager.iteration_result import IterationResult

    spec = BulkIteration(
        "pr", RANKS, PageRankStep(4), side=OUT, parallelism=3, max_supersteps=9
    ).spec
    router = _Router()
    result = IterationResult("pr", {}, 0, False, 1, 0.0, 0, "none")
    fake_router: Any = router
    fake_launcher: Any = _Running()
    store = SuperstepStore(str(tmp_path))
    run = IterationAttempt(spec, 0, 0, fake_router, fake_launcher, [], store, result)
    for i in range(3):
        run._on(P.Register(i, 0, f"iter-{i}", 1, "h", "e"))
    assert [m for _, m in router.sent] == [S.SuperstepGo(1, False)] * 3
    router.sent.clear()
    run._on(S.SuperstepDone(0, 0, 1, 0.5, 4, -1, 0.0))
    run._on(S.SuperstepDone(2, 0, 1, 0.5, 4, -1, 0.0))
    run._on(S.SuperstepDone(2, 0, 1, 0.5, 4, -1, 0.0))  # a duplicate counts once
    assert router.sent == []  # task 1 is slow: everyone waits, however long
    run._on(S.SuperstepDone(1, 0, 1, 0.5, 4, -1, 0.0))
    assert [m for _, m in router.sent] == [S.SuperstepGo(2, False)] * 3
    assert result.aggregates == [(1, 1.5)]


def test_an_unbalanced_superstep_fails_the_run_instead_of_being_decided(tmp_path: Path) -> None:
    from jobmanager.iteration_attempt import IterationAttempt
    from jobmanager.iteration_result import IterationResult

    spec = BulkIteration(
        "pr", RANKS, PageRankStep(4), side=OUT, parallelism=2, max_supersteps=9
    ).spec
    router = _Router()
    result = IterationResult("pr", {}, 0, False, 1, 0.0, 0, "none")
    fake_router: Any = router
    fake_launcher: Any = _Running()
    run = IterationAttempt(
        spec, 0, 0, fake_router, fake_launcher, [], SuperstepStore(str(tmp_path)), result
    )
    for i in range(2):
        run._on(P.Register(i, 0, f"iter-{i}", 1, "h", "e"))
    assert run._on(S.SuperstepDone(0, 0, 1, 0.5, 4, -1, 0.0, 7, 6)) is None
    assert run._on(S.SuperstepDone(1, 0, 1, 0.5, 4, -1, 0.0, 5, 6)) is None  # 12 = 12
    router.sent.clear()
    run._on(S.SuperstepDone(0, 0, 2, 0.5, 4, -1, 0.0, 7, 6))
    outcome = run._on(S.SuperstepDone(1, 0, 2, 0.5, 4, -1, 0.0, 5, 5))  # 12 sent, 11 received
    assert outcome is not None and outcome.fatal and outcome.agreed == 1
    assert "superstep 2 is not balanced: 12 messages sent, 11 received" in (outcome.failure or "")
    assert router.sent == []  # no decision on a partial superstep
