"""PageRank as a bulk iteration (seed 004), checked against networkx.pagerank.

    python examples/pagerank.py                                   # 20,000 vertices, 100,000 edges
    python examples/pagerank.py --recovery optimistic --kill-task pagerank[1] --after superstep:5
    python examples/pagerank.py --recovery tail --interval 3 --kill-task pagerank[0] --after superstep:7
    python examples/pagerank.py --chaos 2 --recovery head
    python examples/pagerank.py --vertices 200000 --edges 1000000  # the seed's scale
    python examples/pagerank.py --local --recovery blocking --interval 3 --kill-task pagerank[1] --after superstep:5

The graph is generated (power-law in-degrees, 10 % dangling vertices, no self-loops).
networkx computes the reference with the same damping (0.85) and tolerance: it stops
when the L1 change is below n * tol, and so does the iteration. The example exits 1
if a rank differs from networkx's by more than 1e-4 or the ranks do not sum to 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples import scaffold
from runtime.iterations import BulkIteration, l1_below
from runtime.iterations.graphs import adjacency, power_law_digraph, rank_order_agreement
from runtime.iterations.library import PageRankStep, pagerank_compensation


def main(argv: list[str] | None = None) -> int:
    ap = scaffold.parser(__doc__)
    ap.add_argument("--vertices", type=int, default=20_000)
    ap.add_argument("--edges", type=int, default=100_000)
    ap.add_argument("--parallelism", type=int, default=3)
    ap.add_argument("--tol", type=float, default=1e-6, help="networkx's tol (stop at L1 < n * tol)")
    ap.add_argument("--seed-graph", type=int, default=1)
    scaffold.add_recovery_arguments(ap)
    return scaffold.run_example(ap, run, argv)


def run(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    import networkx as nx

    n = args.vertices
    edges = power_law_digraph(n, args.edges, seed=args.seed_graph)
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from(edges)
    started = time.perf_counter()
    reference = nx.pagerank(g, alpha=0.85, tol=args.tol, max_iter=1000)
    nx_seconds = time.perf_counter() - started
    it = BulkIteration(
        "pagerank",
        {v: 1.0 / n for v in range(n)},
        PageRankStep(n),
        side=adjacency(n, edges),
        parallelism=args.parallelism,
        max_supersteps=1000,
        converged=l1_below(n * args.tol),
    )
    result = scaffold.run_iteration(ap, args, it, pagerank_compensation)
    print(result.summary())
    ranks = result.solution
    diff = max(abs(ranks[v] - reference[v]) for v in range(n))
    total = sum(ranks.values())
    per_step = [s for _, s in result.superstep_seconds]
    print(
        f"{len(edges):,} edges, {n:,} vertices: {sum(per_step) / max(1, len(per_step)) * 1000:.1f} ms "
        f"per superstep = {len(edges) / (sum(per_step) / max(1, len(per_step))):,.0f} edges/s; "
        f"networkx.pagerank {nx_seconds:.2f} s"
    )
    print(
        f"max |rank - networkx| = {diff:.2e}, sum of ranks = {total:.9f}, "
        f"top-100 agreement {rank_order_agreement(reference, ranks):.0%}"
    )
    ok = diff <= 1e-4 and abs(total - 1.0) < 1e-6
    print("OK: matches networkx" if ok else "MISMATCH with networkx")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
