"""Connected components as a delta iteration (seed 004), checked against union-find.

    python examples/connected_components_bulk.py                  # 50,000 vertices, 2,000 components
    python examples/connected_components_bulk.py --recovery optimistic --kill-task connected_components[2] --after superstep:4
    python examples/connected_components_bulk.py --recovery blocking --interval 2 --kill-task connected_components[0] --after superstep:5
    python examples/connected_components_bulk.py --chaos 2 --recovery tail
    python examples/connected_components_bulk.py --local --recovery blocking --chaos 2

The iteration runs as a Dataflow with a loop on the streaming runtime
(``runtime.api.iterations``); ``--local`` runs its tasks as local processes, no Spark.

(examples/connected_components.py is the asynchronous, streaming-loop version.) The
solution set holds each vertex's label (the smallest vertex id it has heard of); only
vertices whose label changed send again; the iteration ends when no label changed.
The example exits 1 unless every label equals union-find's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples import scaffold
from runtime.iterations import DeltaIteration
from runtime.iterations.graphs import adjacency, components_graph, union_find_labels
from runtime.iterations.library import ConnectedComponentsStep, cc_compensation


def main(argv: list[str] | None = None) -> int:
    ap = scaffold.parser(__doc__)
    ap.add_argument("--vertices", type=int, default=50_000)
    ap.add_argument("--components", type=int, default=2_000)
    ap.add_argument(
        "--extra-edges", type=float, default=1.0, help="edges per vertex beyond a spanning tree"
    )
    ap.add_argument("--parallelism", type=int, default=3)
    ap.add_argument("--seed-graph", type=int, default=2)
    scaffold.add_recovery_arguments(ap)
    return scaffold.run_example(ap, run, argv)


def run(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    n = args.vertices
    edges = components_graph(n, args.components, extra_edges=args.extra_edges, seed=args.seed_graph)
    started = time.perf_counter()
    reference = union_find_labels(n, edges)
    uf_seconds = time.perf_counter() - started
    it = DeltaIteration(
        "connected_components",
        {v: v for v in range(n)},
        ConnectedComponentsStep(),
        side=adjacency(n, edges, undirected=True),
        parallelism=args.parallelism,
    )
    result = scaffold.run_iteration(ap, args, it, cc_compensation, expected_supersteps=20)
    print(result.summary())
    wrong = sum(1 for v in range(n) if result.solution[v] != reference[v])
    print(
        f"{len(edges):,} edges, {n:,} vertices, {len(set(reference.values())):,} components; "
        f"union-find {uf_seconds:.2f} s"
    )
    print("OK: equal to union-find" if wrong == 0 else f"MISMATCH: {wrong} vertices labelled wrong")
    return 0 if wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
