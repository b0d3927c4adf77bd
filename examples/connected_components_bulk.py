"""Connected components as a delta iteration (seed 004), checked against union-find.

    python examples/connected_components_bulk.py                  # 50,000 vertices, 2,000 components
    python examples/connected_components_bulk.py --recovery optimistic --kill-task connected_components[2] --after superstep:4
    python examples/connected_components_bulk.py --recovery blocking --interval 2 --kill-task connected_components[0] --after superstep:5
    python examples/connected_components_bulk.py --chaos 2 --recovery tail
    python examples/connected_components_bulk.py --streaming --threads --recovery blocking --chaos 2

``--streaming`` runs the same iteration as a Dataflow on the streaming runtime
(``runtime.api.iterations``; ``--threads`` then means local task processes, no Spark).

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
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples import scaffold
from runtime.api.iterations import kills_at_supersteps, run_on_streaming
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
    ap.add_argument(
        "--threads",
        action="store_true",
        help="no Spark: the tasks as driver threads (with --streaming: local task processes)",
    )
    ap.add_argument(
        "--streaming",
        action="store_true",
        help="run as a Dataflow on the streaming runtime (runtime.api.iterations); "
        "--recovery none/blocking/tail/head (tail and head checkpoint like blocking there)",
    )
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
    launcher = "threads" if args.threads else "spark"
    result: Any
    if args.streaming:
        result = run_streaming(ap, args, it)
    else:
        result = run_superstep_runtime(ap, args, it, launcher)
    print(result.summary())
    wrong = sum(1 for v in range(n) if result.solution[v] != reference[v])
    print(
        f"{len(edges):,} edges, {n:,} vertices, {len(set(reference.values())):,} components; "
        f"union-find {uf_seconds:.2f} s"
    )
    print("OK: equal to union-find" if wrong == 0 else f"MISMATCH: {wrong} vertices labelled wrong")
    return 0 if wrong == 0 else 1


def run_superstep_runtime(
    ap: argparse.ArgumentParser, args: argparse.Namespace, it: Any, launcher: str
) -> Any:
    """The iteration on its superstep runtime (every recovery style, optimistic too)."""
    expected = 20
    if args.chaos:  # a clean run first: the kills land inside the supersteps it takes
        clean = it.run(launcher=launcher)
        expected = clean.supersteps
        print(f"clean run: {clean.supersteps} supersteps, {clean.seconds:.2f} s")
    kills = scaffold.iteration_kills(ap, args, "connected_components", args.parallelism, expected)
    return it.run(
        recovery=scaffold.recovery_from(args, cc_compensation, expected),
        kills=kills,
        launcher=launcher,
        say=print,
    )


def run_streaming(ap: argparse.ArgumentParser, args: argparse.Namespace, it: Any) -> Any:
    """The iteration as a Dataflow on the streaming runtime (runtime.api.iterations)."""
    if args.recovery == "optimistic":
        ap.error(
            "--streaming: optimistic recovery does not run on the streaming runtime yet; "
            "pass --recovery none, blocking, tail or head (or drop --streaming)"
        )
    launcher = "local" if args.threads else None
    expected = 20
    if args.chaos:  # a clean run first: the kills land inside the supersteps it takes
        clean = run_on_streaming(it, launcher=launcher)
        expected = clean.supersteps
        print(f"clean run: {clean.supersteps} supersteps, {clean.seconds:.2f} s")
    kills = scaffold.iteration_kills(ap, args, "connected_components", args.parallelism, expected)
    return run_on_streaming(
        it,
        scaffold.recovery_from(args, cc_compensation, expected),
        faults=kills_at_supersteps("connected_components", kills),
        launcher=launcher,
    )


if __name__ == "__main__":
    sys.exit(main())
