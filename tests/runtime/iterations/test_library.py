"""The iteration library (runtime/iterations/library.py) by hand: PageRank's and connected
components' supersteps computed with the steps' own methods against direct computations,
and the seed's compensations against their companions that break the invariant."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from runtime.iterations.graphs import (
    adjacency,
    components_graph,
    power_law_digraph,
    union_find_labels,
)
from runtime.iterations.library import (
    ConnectedComponentsStep,
    PageRankStep,
    cc_compensation,
    cc_without_compensation,
    pagerank_compensation,
    pagerank_without_compensation,
)


def test_compensations_follow_the_seed() -> None:
    surviving = {0: 0.3, 1: 0.2}
    assert pagerank_compensation(surviving, frozenset({2, 3}), {}) == {2: 0.25, 3: 0.25}
    values, workset = cc_compensation({0: 0, 1: 0}, frozenset({2}), {2: (1,), 1: (2, 0)})
    assert values == {2: 2} and workset == {1, 2}


def superstep(step: Any, values: dict[int, Any], side: dict[int, Any]) -> dict[int, Any]:
    """One bulk superstep as the runtime runs it: messages combined per target, the
    contributions summed, then every vertex updated."""
    inbox: dict[int, Any] = {}
    total = 0.0
    for v, value in values.items():
        for target, message in step.messages(v, value, side[v]):
            inbox[target] = message if target not in inbox else step.combine(inbox[target], message)
        if hasattr(step, "contribution"):
            total += step.contribution(v, value, side[v])
    return {v: step.update(v, values[v], inbox.get(v), side[v], total) for v in values}


def test_pagerank_supersteps_are_the_power_iteration_with_dangling_mass() -> None:
    n = 40
    side = adjacency(n, power_law_digraph(n, 120, seed=1))
    assert any(not out for out in side.values())  # dangling vertices take part
    step = PageRankStep(n, alpha=0.85)
    ranks = dict.fromkeys(range(n), 1.0 / n)
    m = np.zeros((n, n))  # column-stochastic, a dangling column spread uniformly
    for v, out in side.items():
        for t in out:
            m[t, v] = 1.0 / len(out)
        if not out:
            m[:, v] = 1.0 / n
    r = np.full(n, 1.0 / n)
    for _ in range(30):
        ranks = superstep(step, ranks, side)
        r = 0.85 * m @ r + 0.15 / n
    assert [ranks[v] for v in range(n)] == pytest.approx(list(r), abs=1e-12)
    assert sum(ranks.values()) == pytest.approx(1.0)
    assert step.aggregate(0, 0.25, 0.2) == pytest.approx(0.05)


def test_connected_components_supersteps_converge_to_the_smallest_id() -> None:
    n = 60
    edges = components_graph(n, 7, extra_edges=0.5, seed=2)
    side = adjacency(n, edges, undirected=True)
    step = ConnectedComponentsStep()
    labels = {v: v for v in range(n)}
    for _ in range(n):
        changed = {v: new for v, new in superstep(step, labels, side).items() if new is not None}
        if not changed:
            break
        labels |= changed
    assert labels == union_find_labels(n, edges)
    assert step.update(0, 3, 5, (), 0.0) is None  # a larger label changes nothing


def test_the_pagerank_compensation_restores_the_mass_its_companion_loses() -> None:
    surviving = {0: 0.3, 1: 0.25, 2: 0.05}
    lost = frozenset({3, 4, 5, 6})
    restored = pagerank_compensation(surviving, lost, {})
    assert set(restored) == lost and sum(surviving.values()) + sum(
        restored.values()
    ) == pytest.approx(1.0)
    companion = pagerank_without_compensation(surviving, lost, {})
    assert sum(surviving.values()) + sum(companion.values()) != pytest.approx(1.0)


def test_the_cc_compensation_wakes_the_neighbours_its_companion_leaves_asleep() -> None:
    side = {5: (1, 2), 6: ()}
    values, workset = cc_compensation({1: 1, 2: 1}, frozenset({5, 6}), side)
    assert values == {5: 5, 6: 6} and workset == {1, 2, 5, 6}
    _, asleep = cc_without_compensation({1: 1, 2: 1}, frozenset({5, 6}), side)
    assert asleep == {5, 6}
