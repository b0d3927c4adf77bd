"""Small graphs and references shared by the iteration tests."""

from __future__ import annotations

from typing import Any

import networkx as nx

from runtime.iterations import BulkIteration, DeltaIteration, l1_below
from runtime.iterations.graphs import adjacency, components_graph, power_law_digraph
from runtime.iterations.library import ConnectedComponentsStep, PageRankStep

N_PR = 600
N_CC = 500
PR_EDGES = power_law_digraph(N_PR, 3000, seed=7)
CC_EDGES = components_graph(N_CC, 40, extra_edges=0.3, seed=3)


def pagerank(parallelism: int = 3, max_supersteps: int = 300, tol: float = 1e-10) -> BulkIteration:
    return BulkIteration(
        "pagerank",
        {v: 1.0 / N_PR for v in range(N_PR)},
        PageRankStep(N_PR),
        side=adjacency(N_PR, PR_EDGES),
        parallelism=parallelism,
        max_supersteps=max_supersteps,
        converged=l1_below(N_PR * tol),
    )


def components(parallelism: int = 3, step: Any = None) -> DeltaIteration:
    return DeltaIteration(
        "components",
        {v: v for v in range(N_CC)},
        step or ConnectedComponentsStep(),
        side=adjacency(N_CC, CC_EDGES, undirected=True),
        parallelism=parallelism,
    )


def networkx_ranks(tol: float = 1e-10) -> dict[int, float]:
    g = nx.DiGraph()
    g.add_nodes_from(range(N_PR))
    g.add_edges_from(PR_EDGES)
    ranks: dict[int, float] = nx.pagerank(g, alpha=0.85, tol=tol, max_iter=1000)
    return ranks
