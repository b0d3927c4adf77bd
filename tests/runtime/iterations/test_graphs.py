"""The generated graphs and references (runtime/iterations/graphs.py): the shapes they
promise (no self-loops or duplicates, dangling vertices, exactly k components) and the
union-find reference against a breadth-first search."""

from __future__ import annotations

from collections import Counter

import pytest

from runtime.iterations.graphs import (
    adjacency,
    components_graph,
    power_law_digraph,
    rank_order_agreement,
    union_find_labels,
)


def bfs_labels(n: int, edges: list[tuple[int, int]]) -> dict[int, int]:
    side = adjacency(n, edges, undirected=True)
    labels: dict[int, int] = {}
    for start in range(n):
        if start in labels:
            continue
        seen, frontier = {start}, [start]
        while frontier:
            frontier = [w for v in frontier for w in side[v] if w not in seen]
            seen.update(frontier)
        for v in seen:
            labels[v] = min(seen)
    return labels


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_power_law_digraph_has_no_self_loops_or_duplicates_and_some_dangling(seed: int) -> None:
    n, m = 300, 1500
    edges = power_law_digraph(n, m, seed=seed, dangling=0.2)
    assert len(edges) == m and len(set(edges)) == m
    assert all(a != b and 0 <= a < n and 0 <= b < n for a, b in edges)
    sources = {a for a, _ in edges}
    assert len(sources) <= int(n * 0.8)  # a fifth of the vertices has no out-edge
    in_degrees = sorted(Counter(b for _, b in edges).values(), reverse=True)
    assert in_degrees[0] > 5 * in_degrees[len(in_degrees) // 2]  # a heavy head
    assert power_law_digraph(n, m, seed=seed, dangling=0.2) == edges  # the seed decides


@pytest.mark.parametrize(("n", "k"), [(200, 1), (200, 17), (50, 50)])
def test_the_components_graph_has_exactly_k_components(n: int, k: int) -> None:
    edges = components_graph(n, k, extra_edges=0.5, seed=4)
    labels = union_find_labels(n, edges)
    assert len(set(labels.values())) == k
    assert labels == bfs_labels(n, edges)


def test_more_components_than_vertices_is_refused() -> None:
    with pytest.raises(ValueError, match="5 components need at least as many vertices, not 3"):
        components_graph(3, 5)


def test_adjacency_keeps_every_vertex_and_each_neighbour_once() -> None:
    edges = [(0, 1), (0, 1), (2, 0)]
    assert adjacency(4, edges) == {0: (1,), 1: (), 2: (0,), 3: ()}
    assert adjacency(4, edges, undirected=True) == {0: (1, 2), 1: (0,), 2: (0,), 3: ()}


def test_rank_order_agreement_is_the_shared_share_of_the_top() -> None:
    a = {v: float(10 - v) for v in range(10)}  # top 3: 0, 1, 2
    b = {v: float(v) for v in range(10)}  # top 3: 9, 8, 7
    assert rank_order_agreement(a, a, top=3) == 1.0
    assert rank_order_agreement(a, b, top=3) == 0.0
    assert rank_order_agreement(a, {0: 1.0, 5: 0.9, 1: 0.8}, top=3) == pytest.approx(2 / 3)
