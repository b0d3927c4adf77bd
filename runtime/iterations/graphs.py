"""Generated graphs with the shape of seed 004's data sets, and references computed
outside the runtime (union-find for components; the examples use networkx for ranks).

* ``power_law_digraph``: directed, in-degrees follow a power law (targets drawn with
  weight rank^-exponent), a share of vertices has no out-edge (dangling), no self-loops
  or duplicate edges.
* ``components_graph``: undirected, many components of power-law sizes, each a random
  tree plus extra edges.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["adjacency", "components_graph", "power_law_digraph", "union_find_labels"]


def power_law_digraph(
    n_vertices: int, n_edges: int, seed: int = 0, dangling: float = 0.1, exponent: float = 0.8
) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, n_vertices + 1) ** exponent
    weights /= weights.sum()
    perm = rng.permutation(n_vertices)
    n_sources = max(1, int(n_vertices * (1.0 - dangling)))
    sources_pool = rng.permutation(n_vertices)[:n_sources]
    src = sources_pool[rng.integers(0, n_sources, size=n_edges * 2)]
    dst = perm[rng.choice(n_vertices, size=n_edges * 2, p=weights)]
    keep = src != dst
    pairs = np.unique(np.stack([src[keep], dst[keep]], axis=1), axis=0)
    pairs = pairs[rng.permutation(len(pairs))[:n_edges]]
    return [(int(a), int(b)) for a, b in pairs]


def components_graph(
    n_vertices: int, n_components: int, extra_edges: float = 1.0, seed: int = 0
) -> list[tuple[int, int]]:
    """Edges of an undirected graph (each once) with exactly ``n_components``
    components (isolated vertices count), vertex ids shuffled."""
    rng = np.random.default_rng(seed)
    if n_components > n_vertices:
        raise ValueError(
            f"{n_components} components need at least as many vertices, not {n_vertices}"
        )
    weights = rng.zipf(2.0, size=n_components).astype(float)
    weights /= weights.sum()
    sizes = 1 + np.floor(weights * (n_vertices - n_components)).astype(int)  # power-law sizes
    sizes[int(np.argmax(sizes))] += n_vertices - int(sizes.sum())
    ids = rng.permutation(n_vertices)
    edges: list[tuple[int, int]] = []
    start = 0
    for size in sizes:
        members = ids[start : start + size]
        start += size
        for i in range(1, size):
            edges.append((int(members[i]), int(members[rng.integers(0, i)])))
        for _ in range(int((size - 1) * extra_edges)):
            a, b = rng.integers(0, size, size=2)
            if a != b:
                edges.append((int(members[a]), int(members[b])))
    return edges


def adjacency(
    n_vertices: int, edges: list[tuple[int, int]], undirected: bool = False
) -> dict[int, tuple[int, ...]]:
    out: dict[int, list[int]] = {v: [] for v in range(n_vertices)}
    for a, b in edges:
        out[a].append(b)
        if undirected:
            out[b].append(a)
    return {v: tuple(dict.fromkeys(ns)) for v, ns in out.items()}


def union_find_labels(n_vertices: int, edges: list[tuple[int, int]]) -> dict[int, int]:
    """Each vertex's component label = the smallest vertex id in its component."""
    parent = list(range(n_vertices))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in edges:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return {v: find(v) for v in range(n_vertices)}


def rank_order_agreement(a: dict[Any, float], b: dict[Any, float], top: int = 100) -> float:
    """Share of the top-``top`` vertices of ``a`` that are also in ``b``'s top."""
    ta = sorted(a, key=lambda k: -a[k])[:top]
    tb = set(sorted(b, key=lambda k: -b[k])[:top])
    return sum(1 for k in ta if k in tb) / max(1, len(ta))
