"""Seed 004's comparison on this machine: superstep-checkpoint overhead (Table 4) and
optimistic vs pessimistic recovery from one kill at half the supersteps (figs. 19-23),
for PageRank (bulk) and connected components (delta), plus PageRank throughput next to
networkx.pagerank on the same graph.

    python benchmarks/iterations.py                      # small: threads, ~30 s
    python benchmarks/iterations.py --launcher spark --vertices 200000 --edges 1000000

Prints a markdown table (and writes it with --out); with matplotlib (``.[bench]``) a PNG
of the overhead and recovery bars beside it. Checkpoint interval k = round(sqrt(n)),
n = the failure-free superstep count (the seed's choice). Times are the job manager's
wall time of the iteration (the Spark session's start is not in them); each figure is
the median of --repeat runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runtime.iterations import BulkIteration, DeltaIteration, Recovery, l1_below
from runtime.iterations.api import RecoveryMode
from runtime.iterations.graphs import (
    adjacency,
    components_graph,
    power_law_digraph,
    rank_order_agreement,
    union_find_labels,
)
from runtime.iterations.library import (
    ConnectedComponentsStep,
    PageRankStep,
    cc_compensation,
    pagerank_compensation,
)

MODES: tuple[RecoveryMode, ...] = ("blocking", "tail", "head")
KILL_MODES: tuple[RecoveryMode, ...] = ("optimistic", *MODES, "none")


def median_run(it: Any, recovery: Recovery, kills: list[tuple[int, int]], args: Any) -> Any:
    runs = [
        it.run(recovery=recovery, kills=list(kills), launcher=args.launcher)
        for _ in range(args.repeat)
    ]
    runs.sort(key=lambda r: r.seconds)
    return runs[len(runs) // 2]


def study(name: str, it: Any, compensation: Any, check: Any, args: Any) -> dict[str, Any]:
    clean = median_run(it, Recovery("none"), [], args)
    n = clean.supersteps
    k = max(1, round(n**0.5))
    rows: dict[str, Any] = {"clean": clean, "n": n, "k": k, "overhead": {}, "kill": {}}
    for mode in MODES:
        r = median_run(it, Recovery(mode, interval=k), [], args)
        rows["overhead"][mode] = (r.seconds, (r.seconds - clean.seconds) / clean.seconds * 100)
    at = max(2, n // 2)
    for mode in KILL_MODES:
        rec = Recovery(
            mode, interval=k, compensation=compensation if mode == "optimistic" else None
        )
        r = median_run(it, rec, [(1, at)], args)
        rows["kill"][mode] = (r, check(r.solution, clean.solution))
    rows["kill_at"] = at
    print(f"{name}: {n} supersteps failure-free, {clean.seconds:.2f} s, k = {k}", file=sys.stderr)
    return rows


def pagerank_check(got: dict[int, float], ref: dict[int, float]) -> str:
    diff = max(abs(got[v] - ref[v]) for v in ref)
    return f"max abs d-rank {diff:.1e}, top-100 order {rank_order_agreement(ref, got):.0%}"


def cc_check(got: dict[int, int], ref: dict[int, int]) -> str:
    wrong = sum(1 for v in ref if got[v] != ref[v])
    return "exact" if wrong == 0 else f"{wrong} labels wrong"


def table(name: str, rows: dict[str, Any]) -> str:
    clean = rows["clean"]
    out = [
        f"### {name} ({rows['n']} supersteps failure-free, checkpoint every k = {rows['k']})",
        "",
        "| checkpointing | time (s) | overhead vs no FT |",
        "|---|---:|---:|",
        f"| none (no FT) | {clean.seconds:.3f} | - |",
    ]
    for mode, (sec, pct) in rows["overhead"].items():
        out.append(f"| {mode} | {sec:.3f} | {pct:+.1f} % |")
    out += [
        "",
        f"One kill of task 1 as superstep {rows['kill_at']} starts:",
        "",
        "| recovery | total time (s) | resumed from | supersteps re-run | result vs failure-free |",
        "|---|---:|---:|---:|---|",
    ]
    for mode, (r, verdict) in rows["kill"].items():
        rec = r.recoveries[0] if r.recoveries else None
        resumed = f"{rec.resumed_from} ({rec.kind})" if rec else "-"
        out.append(f"| {mode} | {r.seconds:.3f} | {resumed} | {r.rerun} | {verdict} |")
    return "\n".join(out)


def plot(path: str, studies: dict[str, dict[str, Any]]) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.35
    for i, (name, rows) in enumerate(studies.items()):
        xs = [j + i * width for j in range(len(MODES))]
        axes[0].bar(xs, [rows["overhead"][m][1] for m in MODES], width, label=name)
        kill_modes = list(rows["kill"])
        xs2 = [j + i * width for j in range(len(kill_modes))]
        axes[1].bar(xs2, [rows["kill"][m][0].seconds for m in kill_modes], width, label=name)
    axes[0].set_xticks([j + width / 2 for j in range(len(MODES))], MODES)
    axes[0].set_ylabel("overhead vs no fault tolerance (%)")
    axes[0].set_title("superstep checkpoints (seed 004 Table 4)")
    first = next(iter(studies.values()))
    axes[1].set_xticks([j + width / 2 for j in range(len(first["kill"]))], list(first["kill"]))
    axes[1].set_ylabel("total time with one kill (s)")
    axes[1].set_title("recovery from one kill at n/2")
    for ax in axes:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--vertices", type=int, default=5_000)
    ap.add_argument("--edges", type=int, default=25_000)
    ap.add_argument("--cc-vertices", type=int, default=10_000)
    ap.add_argument("--components", type=int, default=500)
    ap.add_argument("--parallelism", type=int, default=3)
    ap.add_argument("--tol", type=float, default=1e-8)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--launcher", choices=("threads", "spark"), default="threads")
    ap.add_argument("--only", choices=("pagerank", "cc"), default=None, help="one study only")
    ap.add_argument("--out", default=None, help="write the markdown here (and the PNG beside it)")
    args = ap.parse_args(argv)
    import networkx as nx

    n = args.vertices
    edges = power_law_digraph(n, args.edges, seed=1)
    pr = BulkIteration(
        "pagerank",
        {v: 1.0 / n for v in range(n)},
        PageRankStep(n),
        side=adjacency(n, edges),
        parallelism=args.parallelism,
        max_supersteps=1000,
        converged=l1_below(n * args.tol),
    )
    cn = args.cc_vertices
    cc_edges = components_graph(cn, args.components, seed=2)
    cc = DeltaIteration(
        "connected_components",
        {v: v for v in range(cn)},
        ConnectedComponentsStep(),
        side=adjacency(cn, cc_edges, undirected=True),
        parallelism=args.parallelism,
    )
    studies: dict[str, dict[str, Any]] = {}
    if args.only in (None, "pagerank"):
        studies["PageRank"] = study("PageRank", pr, pagerank_compensation, pagerank_check, args)
    if args.only in (None, "cc"):
        studies["Connected components"] = study("CC", cc, cc_compensation, cc_check, args)
        ref = union_find_labels(cn, cc_edges)
        assert cc_check(studies["Connected components"]["clean"].solution, ref) == "exact"
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from(edges)
    started = time.perf_counter()
    nx.pagerank(g, alpha=0.85, tol=args.tol, max_iter=1000)
    nx_seconds = time.perf_counter() - started
    text = "\n\n".join(table(name, rows) for name, rows in studies.items())
    clean = (studies.get("PageRank") or {}).get("clean") or pr.run(launcher=args.launcher)
    per_step = statistics.median(s for _, s in clean.superstep_seconds)
    text += (
        f"\n\nPageRank throughput ({len(edges):,} edges, {n:,} vertices, p = {args.parallelism}, "
        f"{args.launcher}): {per_step * 1000:.1f} ms per superstep (median) = "
        f"{len(edges) / per_step:,.0f} edges/s per superstep; networkx.pagerank on the same graph: "
        f"{nx_seconds:.3f} s for the whole run ({clean.supersteps} supersteps here) = "
        f"{len(edges) * clean.supersteps / nx_seconds:,.0f} edges/s\n"
    )
    header = (
        f"Measured by `python benchmarks/iterations.py {' '.join(argv or sys.argv[1:])}` "
        f"({args.launcher}, repeat {args.repeat}).\n\n"
    )
    print(header + text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(header + text)
        png = os.path.splitext(args.out)[0] + ".png"
        if plot(png, studies):
            print(f"plot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
