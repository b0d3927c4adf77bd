"""Seed 004's comparison on this machine: superstep-checkpoint overhead (its Table 4)
and the run time with one kill at half the supersteps under optimistic vs pessimistic
recovery (its figs. 19-23), for PageRank (bulk) and connected components (delta), plus
PageRank throughput next to networkx.pagerank on the same graph, in the same run.

    python benchmarks/iterations.py                       # small: threads, ~1 min
    python benchmarks/iterations.py --vertices 20000 --edges 100000 \\
        --cc-vertices 50000 --cc-edges 100000 --repeat 3 --plot docs/iterations-bench.png

Every configuration runs ``--repeat`` times; the runs are interleaved (round r runs
every configuration once, after one warm-up run), so a load change hits them all alike.
Figures are the median with the spread [min-max]; an overhead is computed per round
(configuration vs the failure-free run of the same round), then its median and spread.
Checkpoint interval k = round(sqrt(n)), n = the failure-free superstep count (the
seed's choice); the kill ends task 1 as superstep n/2 starts. Times are the job
manager's wall time of the iteration (a Spark session's start is not in them).

Prints markdown tables and writes them to benchmarks/results/iterations.json (``python
benchmarks/render.py`` puts them in docs/benchmarks.md); ``--plot`` also draws the four
panels to that PNG when matplotlib is installed (``pip install .[bench]``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.iterations_plot import plot
from benchmarks.results import write_result
from runtime.api.iterations import RecoveryMode
from runtime.iterations import BulkIteration, DeltaIteration, Recovery, l1_below
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

CHECKPOINTS: tuple[RecoveryMode, ...] = ("blocking", "tail", "head")
KILL_MODES: tuple[RecoveryMode, ...] = ("optimistic", *CHECKPOINTS, "none")
# seed 004 Table 4 (overhead vs no fault tolerance, %): head, tail, blocking
SEED_TABLE4 = {
    "PageRank": ("as-Skitter", {"head": 16.4, "tail": 11.9, "blocking": 34.6}),
    "Connected components": ("data1", {"head": 9.6, "tail": 2.7, "blocking": 18.8}),
}
SEED_OPTIMISTIC_GAIN = {"PageRank": 16.81, "Connected components": 24.2}  # % vs restart


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


@dataclass
class Config:
    """One configuration of a study and its runs (one per round)."""

    label: str
    recovery: Recovery
    kill: bool
    runs: list[Any] = field(default_factory=list)

    @property
    def seconds(self) -> list[float]:
        return [r.seconds for r in self.runs]

    @property
    def median_run(self) -> Any:
        return sorted(self.runs, key=lambda r: r.seconds)[len(self.runs) // 2]


@dataclass
class Study:
    name: str
    shape: str
    n: int
    k: int
    kill_at: int
    clean: Config
    overhead: dict[str, Config]
    recovery: dict[str, Config]
    checks: dict[str, str]

    def overhead_pct(self, mode: str) -> list[float]:
        """Per round: (checkpointed - failure-free) / failure-free, in %."""
        pairs = zip(self.overhead[mode].seconds, self.clean.seconds, strict=True)
        return [(s - c) / c * 100 for s, c in pairs]

    def gain_pct(self, mode: str, over: str = "none") -> list[float]:
        """Per round: how much faster ``mode`` recovered than ``over`` (%)."""
        pairs = zip(self.recovery[mode].seconds, self.recovery[over].seconds, strict=True)
        return [(o - s) / o * 100 for s, o in pairs]


def run_study(name: str, shape: str, it: Any, compensation: Any, check: Any, args: Any) -> Study:
    warm = it.run(recovery=Recovery("none"), launcher=args.launcher)  # warm-up; sets n
    n = warm.supersteps
    k = max(1, round(n**0.5))
    at = max(2, n // 2)
    clean = Config("none", Recovery("none"), False)
    overhead = {m: Config(m, Recovery(m, interval=k), False) for m in CHECKPOINTS}
    recovery = {
        m: Config(
            m,
            Recovery(m, interval=k, compensation=compensation if m == "optimistic" else None),
            True,
        )
        for m in KILL_MODES
    }
    configs = [clean, *overhead.values(), *recovery.values()]
    for r in range(args.repeat):
        for c in configs:
            kills = [(1, at)] if c.kill else []
            c.runs.append(it.run(recovery=c.recovery, kills=kills, launcher=args.launcher))
        print(f"{name}: round {r + 1}/{args.repeat} done", file=sys.stderr)
    ref = clean.median_run.solution
    checks = {m: check([run.solution for run in c.runs], ref) for m, c in recovery.items()}
    return Study(name, shape, n, k, at, clean, overhead, recovery, checks)


def pagerank_check(solutions: list[dict[int, float]], ref: dict[int, float]) -> str:
    """Worst over the runs: max |Δrank| and top-100 rank-order agreement."""
    diff = max(max(abs(got[v] - ref[v]) for v in ref) for got in solutions)
    order = min(rank_order_agreement(ref, got) for got in solutions)
    return f"max abs d-rank {diff:.1e}, top-100 order {order:.0%}"


def cc_check(solutions: list[dict[int, int]], ref: dict[int, int]) -> str:
    wrong = max(sum(1 for v in ref if got[v] != ref[v]) for got in solutions)
    return "exact" if wrong == 0 else f"up to {wrong} labels wrong"


def table4(studies: list[Study]) -> str:
    out = [
        "| algorithm | graph | supersteps n | k | no FT (s) | blocking | tail | head | "
        "order (cheapest first) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for s in studies:
        pct = {m: s.overhead_pct(m) for m in CHECKPOINTS}
        order = " < ".join(sorted(CHECKPOINTS, key=lambda m: statistics.median(pct[m])))
        cells = " | ".join(spread(pct[m], "{:+.1f}") + " %" for m in CHECKPOINTS)
        out.append(
            f"| {s.name} | {s.shape} | {s.n} | {s.k} | {spread(s.clean.seconds)} | {cells} | "
            f"{order} |"
        )
        graph, seed = SEED_TABLE4[s.name]
        seed_order = " < ".join(sorted(seed, key=lambda m: seed[m]))
        seed_cells = " | ".join(f"{seed[m]:+.1f} %" for m in CHECKPOINTS)
        out.append(f"| seed 004 | {graph} | | | | {seed_cells} | {seed_order} |")
    return "\n".join(out)


def recovery_table(s: Study) -> str:
    out = [
        f"{s.name}: one kill of task 1 as superstep {s.kill_at} of {s.n} starts "
        f"(failure-free {spread(s.clean.seconds)} s)",
        "",
        "| recovery | total time (s) | resumed from | supersteps re-run | faster than a "
        "restart | result vs failure-free |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for mode, c in s.recovery.items():
        r = c.median_run
        rec = r.recoveries[0] if r.recoveries else None
        resumed = f"{rec.resumed_from} ({rec.kind})" if rec else "-"
        gain = "-" if mode == "none" else spread(s.gain_pct(mode), "{:+.1f}") + " %"
        reruns = sorted({run.rerun for run in c.runs})
        out.append(
            f"| {mode} | {spread(c.seconds)} | {resumed} | {'/'.join(map(str, reruns))} | "
            f"{gain} | {s.checks[mode]} |"
        )
    seed = SEED_OPTIMISTIC_GAIN[s.name]
    out.append(f"\nSeed 004: optimistic {seed} % faster than a restart.")
    return "\n".join(out)


def throughput(it: BulkIteration, edges: int, vertices: int, clean: Config, args: Any) -> str:
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(range(vertices))
    g.add_edges_from((u, v) for u, outs in it.side.items() for v in outs)
    nx_runs = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        nx.pagerank(g, alpha=0.85, tol=args.tol, max_iter=1000)
        nx_runs.append(time.perf_counter() - started)
    run = clean.median_run
    per_step = [s for r in clean.runs for _, s in r.superstep_seconds]
    nx_rate = [edges * run.supersteps / s for s in nx_runs]
    return (
        f"PageRank throughput ({edges:,} edges, {vertices:,} vertices, p = {args.parallelism}, "
        f"{args.launcher}): {spread([s * 1000 for s in per_step], '{:.1f}')} ms per superstep "
        f"= {spread([edges / s for s in per_step], '{:,.0f}')} edges/s per superstep; "
        f"networkx.pagerank on the same graph: {spread(nx_runs, '{:.3f}')} s for the whole run "
        f"({run.supersteps} supersteps here) = {spread(nx_rate, '{:,.0f}')} edges/s"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--vertices", type=int, default=4_000)
    ap.add_argument("--edges", type=int, default=20_000)
    ap.add_argument("--cc-vertices", type=int, default=8_000)
    ap.add_argument("--cc-edges", type=int, default=16_000, help="about; plus the trees")
    ap.add_argument("--components", type=int, default=None, help="default: cc-vertices / 20")
    ap.add_argument("--parallelism", type=int, default=3)
    ap.add_argument("--tol", type=float, default=1e-8)
    ap.add_argument("--repeat", type=int, default=1, help="runs per configuration")
    ap.add_argument("--launcher", choices=("threads", "spark"), default="threads")
    ap.add_argument("--only", choices=("pagerank", "cc"), default=None, help="one study only")
    ap.add_argument("--plot", default=None, help="also draw the four panels to this PNG")
    args = ap.parse_args(argv)
    started = time.perf_counter()
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
    n_components = args.components or max(1, cn // 20)
    tree = cn - n_components  # edges of the spanning trees; extra_edges is per tree edge
    extra = max(0.0, (args.cc_edges - tree) / max(1, tree))
    cc_edges = components_graph(cn, n_components, extra_edges=extra, seed=2)
    cc = DeltaIteration(
        "connected_components",
        {v: v for v in range(cn)},
        ConnectedComponentsStep(),
        side=adjacency(cn, cc_edges, undirected=True),
        parallelism=args.parallelism,
    )
    studies: list[Study] = []
    if args.only in (None, "pagerank"):
        shape = f"power law, {n:,} v / {len(edges):,} e"
        studies.append(
            run_study("PageRank", shape, pr, pagerank_compensation, pagerank_check, args)
        )
    if args.only in (None, "cc"):
        shape = f"{n_components:,} components, {cn:,} v / {len(cc_edges):,} e"
        study = run_study("Connected components", shape, cc, cc_compensation, cc_check, args)
        ref = union_find_labels(cn, cc_edges)
        assert cc_check([study.clean.median_run.solution], ref) == "exact", "CC is wrong"
        studies.append(study)
    parts = [
        "Superstep checkpoint overhead vs no fault tolerance (seed 004 Table 4), "
        "median [min-max] over the rounds:",
        table4(studies),
        *(recovery_table(s) for s in studies),
    ]
    if studies and studies[0].name == "PageRank":
        parts.append(throughput(pr, len(edges), n, studies[0].clean, args))
    header = (
        f"Measured by `python benchmarks/iterations.py {' '.join(argv or sys.argv[1:])}` "
        f"({args.launcher}, {args.repeat} round(s), {time.perf_counter() - started:.0f} s "
        f"in all)."
    )
    text = "\n\n".join([header, *parts]) + "\n"
    print(text)
    # The tables as this run formatted them (median [min-max] over the rounds):
    # ``python benchmarks/render.py`` puts them in docs/benchmarks.md.
    write_result(
        "iterations",
        {"launcher": args.launcher, "tables": parts, "seconds": time.perf_counter() - started},
        rounds=args.repeat,
        argv=sys.argv if argv is None else [sys.argv[0], *argv],
    )
    if args.plot:
        if plot(args.plot, studies):
            print(f"plot: {args.plot}")
        else:
            print("no plot: matplotlib is not installed (pip install .[bench])")
    return 0


if __name__ == "__main__":
    sys.exit(main())
