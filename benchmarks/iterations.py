"""Seed 004's figures on the streaming runtime (``runtime.api.iterations.run_on_streaming``:
an iteration is a Dataflow with a loop; superstep checkpoints in the blocking, tail and
head styles, ``superstep_checkpoint_style``).

1. **Recovery** (figs. 17-18 with the right quantity): one task of p killed as an early,
   a middle or a late superstep starts; per recovery (tail / head / blocking checkpoints
   every k = round(sqrt(n)) supersteps, the seed's choice; "none": a restart from the
   start; "optimistic" where ``run_on_streaming`` runs it) the *extra supersteps* (the
   supersteps started in all attempts minus the clean run's), the *seconds lost* (the
   run's time minus the clean run's of the same round) and the restart's recovery time
   (failure to the next attempt's first record), and the result against the clean
   run's (PageRank: max |d rank| and whether the top 100 stay within 10 places; CC:
   exact labels).
2. **Table 4**: PageRank for a fixed number of supersteps and connected components (a
   delta iteration) to convergence, with a checkpoint at every
   boundary, per style and without ("none"), in interleaved rounds: the time per
   superstep (first superstep's start to the end decision, over the supersteps), each
   style's cost against "none" of the same round as a median with its 95 % interval
   (``benchmarks/verdicts.py``: 6 rounds or more; fewer give the IQR and say so) and
   a verdict. PageRank twice: with the graph's own state, and in a ballast regime
   (``--ballast`` bytes per vertex in the side input, which every checkpoint writes)
   where a checkpoint write is comparable to a superstep, so overlap can show.
3. **PageRank supersteps/s** against networkx on the same graph in one run (networkx's
   power iteration run for a fixed number of iterations: its iterations/s).

A quick run at reduced size (every part, local launcher)::

    python benchmarks/iterations.py      # = --vertices 1000 --edges 5000 --cc-vertices 2000
                                         #   --cc-edges 4000 --recovery-p 2 4 --rounds 6
                                         #   --table-supersteps 8 --ballast 2000

The recorded figures (docs/iterations.md), each part by its own run (``--tag`` keeps
them apart in the result file)::

    python benchmarks/iterations.py --launcher spark --only table4 networkx \
        --vertices 100000 --edges 1000000 --cc-vertices 100000 --cc-edges 1000000 \
        --rounds 6 --table-supersteps 5 --ballast 3000 --tag table4-spark
    python benchmarks/iterations.py --only recovery --vertices 10000 --edges 50000 \
        --cc-vertices 10000 --cc-edges 20000 --recovery-p 2 4 --recovery-rounds 2 --tag recovery
    python benchmarks/iterations.py --only recovery --vertices 1000 --edges 5000 \
        --cc-vertices 1000 --cc-edges 2000 --recovery-p 10 --recovery-rounds 1 --tag recovery-p10

Writes the tables to ``benchmarks/results/iterations.json`` (``python
benchmarks/render.py`` puts them in docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from results import RESULTS_DIR, tree_commit, write_result
from verdicts import Interval, time_difference

from runtime.api.iterations import IterationRun, kills_at_supersteps, run_on_streaming
from runtime.errors import GraphError
from runtime.iterations import BulkIteration, DeltaIteration, Recovery, Step, l1_below
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
    pagerank_compensation,
)

STYLES = ("blocking", "tail", "head")
RECOVERIES = ("optimistic", *STYLES, "none")
KILLED_TASK = 1


# -- the iterations --------------------------------------------------------------------
class BallastPageRank(Step):
    """PageRank whose side input is ``(out-neighbours, ballast bytes)``: the same ranks, a
    bigger state (the side input is in keyed state: every checkpoint writes it)."""

    name = "pagerank"
    combine = staticmethod(PageRankStep.combine)

    def __init__(self, n_vertices: int) -> None:
        self.inner = PageRankStep(n_vertices)

    def messages(self, key: Any, value: float, side: Any) -> Any:
        return self.inner.messages(key, value, side[0])

    def contribution(self, key: Any, value: float, side: Any) -> float:
        return self.inner.contribution(key, value, side[0])

    def update(self, key: Any, value: float, inbox: Any, side: Any, total: float) -> float:
        return self.inner.update(key, value, inbox, side[0], total)

    def aggregate(self, key: Any, old: float, new: float) -> float:
        return abs(new - old)


def pagerank(
    n: int,
    edges: list[tuple[int, int]],
    p: int,
    tol: float,
    max_supersteps: int = 1000,
    ballast: int = 0,
) -> BulkIteration:
    side: dict[int, Any] = adjacency(n, edges)
    step: Step = PageRankStep(n)
    if ballast:
        pad = b"\x5a" * ballast
        side = {v: (outs, pad) for v, outs in side.items()}
        step = BallastPageRank(n)
    return BulkIteration(
        "pagerank",
        {v: 1.0 / n for v in range(n)},
        step,
        side=side,
        parallelism=p,
        max_supersteps=max_supersteps,
        converged=l1_below(n * tol) if tol > 0 else None,
    )


def components(n: int, edges: list[tuple[int, int]], p: int) -> DeltaIteration:
    return DeltaIteration(
        "components",
        {v: v for v in range(n)},
        ConnectedComponentsStep(),
        side=adjacency(n, edges, undirected=True),
        parallelism=p,
    )


def run(it: Any, mode: str, interval: int, kill_at: int | None, args: Any) -> IterationRun | str:
    """One run; a string says why the run was skipped (optimistic where the streaming
    runtime refuses it: no row is made up for it)."""
    compensation = None
    if mode == "optimistic":
        compensation = cc_compensation if it.spec.delta else pagerank_compensation
    kills = [] if kill_at is None else kills_at_supersteps(it.spec.name, [(KILLED_TASK, kill_at)])
    # checkpoint_dir None: a temp dir of the run's own, removed after it
    recovery = Recovery(mode, interval=interval, compensation=compensation)  # type: ignore[arg-type]
    try:
        return run_on_streaming(it, recovery, faults=kills, launcher=args.launcher, progress=False)
    except GraphError as err:
        if mode == "optimistic":
            return f"skipped: {err}"
        raise


# -- 1. recovery -----------------------------------------------------------------------
@dataclass
class RecoveryRow:
    algorithm: str
    p: int
    where: str
    kill_at: int
    mode: str
    extra: list[int] = field(default_factory=list)
    lost: list[float] = field(default_factory=list)
    restart_s: list[float] = field(default_factory=list)
    resumed: list[int] = field(default_factory=list)
    check: list[str] = field(default_factory=list)
    skipped: str = ""


def pagerank_check(got: dict[int, float], ref: dict[int, float]) -> str:
    """max |d rank| and the seed's closeness: the clean top 100 within 10 places."""
    diff = max(abs(got[v] - ref[v]) for v in ref)
    top_ref = sorted(ref, key=lambda v: -ref[v])[:100]
    place = {v: i for i, v in enumerate(sorted(got, key=lambda v: -got[v]))}
    close = all(abs(place[v] - i) <= 10 for i, v in enumerate(top_ref))
    return f"max d {diff:.0e}, top-100 {'within' if close else 'NOT within'} 10 places"


def cc_check(got: dict[int, int], ref: dict[int, int]) -> str:
    wrong = sum(1 for v in ref if got.get(v) != ref[v])
    return "exact" if wrong == 0 else f"{wrong} labels WRONG"


def recovery_study(
    name: str,
    make: Callable[[int], Any],
    check: Callable[[Any, Any], str],
    ps: list[int],
    args: Any,
) -> tuple[list[RecoveryRow], dict[int, tuple[int, int]]]:
    rows: list[RecoveryRow] = []
    shape: dict[int, tuple[int, int]] = {}  # p -> (clean supersteps, k)
    for p in ps:
        it = make(p)
        warm = run(it, "none", 1, None, args)
        assert isinstance(warm, IterationRun)
        n = warm.supersteps
        k = max(1, round(n**0.5))
        shape[p] = (n, k)
        points = {"early": max(2, n // 4), "middle": max(2, n // 2), "late": max(2, 3 * n // 4)}
        cells = [
            RecoveryRow(name, p, where, at, mode)
            for where, at in points.items()
            for mode in RECOVERIES
        ]
        rows.extend(cells)
        for r in range(args.recovery_rounds):
            clean = run(it, "none", 1, None, args)
            assert isinstance(clean, IterationRun)
            for cell in cells:
                if cell.skipped:
                    continue
                got = run(it, cell.mode, k, cell.kill_at, args)
                if isinstance(got, str):
                    cell.skipped = got
                    continue
                cell.extra.append(got.supersteps_started - clean.supersteps_started)
                cell.lost.append(got.seconds - clean.seconds)
                secs = [s for s in (x.recovery_seconds for x in got.job.restarts) if s is not None]
                cell.restart_s.extend(secs)
                cell.resumed.extend(x.resumed_from for x in got.recoveries)
                cell.check.append(check(got.solution, clean.solution))
            print(f"recovery {name} p={p}: round {r + 1}/{args.recovery_rounds}", file=sys.stderr)
    return rows, shape


def med(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    m = statistics.median(values)
    if len(values) == 1:
        return fmt.format(m)
    return f"{fmt.format(m)} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def recovery_table(rows: list[RecoveryRow], shape: dict[int, tuple[int, int]], name: str) -> str:
    head = [
        f"{name}: task {KILLED_TASK} of p killed as the superstep starts; clean run "
        + ", ".join(
            f"p = {p}: {n} supersteps, checkpoints every k = {k}" for p, (n, k) in shape.items()
        )
        + ". Median [min-max] over the rounds.",
        "",
        "| p | failure at | recovery | extra supersteps | seconds lost | restart to first "
        "record (s) | resumed after | result vs clean |",
        "|---:|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if r.skipped:
            head.append(f"| {r.p} | {r.where} ({r.kill_at}) | {r.mode} | {r.skipped} | | | | |")
            continue
        checks = sorted(set(r.check))
        head.append(
            f"| {r.p} | {r.where} ({r.kill_at}) | {r.mode} | {med([float(x) for x in r.extra], '{:.0f}')} "
            f"| {med(r.lost, '{:.2f}')} | {med(r.restart_s, '{:.2f}')} | "
            f"{'/'.join(str(x) for x in sorted(set(r.resumed)))} | {'; '.join(checks)} |"
        )
    return "\n".join(head)


# -- 2. Table 4 ------------------------------------------------------------------------
@dataclass
class CostStudy:
    regime: str
    per_superstep_ms: dict[str, list[float]]
    checkpoint_ms: dict[str, list[float]]  # median checkpoint duration per run
    write_ms: dict[str, list[float]]  # median slowest task's write (async) per run
    state_mb: float


def cost_study(regime: str, it: Any, args: Any) -> CostStudy:
    configs = ("none", *STYLES)
    per: dict[str, list[float]] = {c: [] for c in configs}
    chk: dict[str, list[float]] = {c: [] for c in configs}
    write: dict[str, list[float]] = {c: [] for c in configs}
    state = 0.0
    run(it, "none", 1, None, args)  # warm-up
    for r in range(args.rounds):
        order = configs if r % 2 == 0 else tuple(reversed(configs))
        for c in order:
            got = run(it, c, 1, None, args)
            assert isinstance(got, IterationRun)
            per[c].append(got.progress.iterating_seconds / got.supersteps * 1000)
            stats = [s for s in got.job.checkpoints if not s.final]
            if stats:
                chk[c].append(statistics.median(s.summary.duration_ms for s in stats))
                write[c].append(statistics.median(s.summary.max_async_ms for s in stats))
                state = max(state, max(s.summary.state_bytes for s in stats) / 1e6)
        print(f"table 4 {regime}: round {r + 1}/{args.rounds}", file=sys.stderr)
    return CostStudy(regime, per, chk, write, state)


def cost_table(studies: list[CostStudy], args: Any) -> str:
    out = [
        f"p = {args.table_p}; PageRank for {args.table_supersteps} supersteps, connected "
        "components (a delta iteration) to convergence; a checkpoint at every boundary; "
        "interleaved rounds (the order reversed every other round). Cost = "
        "the style's time per superstep over the same round's without checkpoints, minus 1; "
        "verdict by `benchmarks/verdicts.py` (slower / faster only when the whole interval "
        "is on one side, else unresolved).",
        "",
        "| iteration (largest checkpoint) | style | ms per superstep | checkpoint (ms) | slowest write (ms) | "
        "cost vs none | verdict | vs blocking | verdict |",
        "|---|---|---:|---:|---:|---:|---|---:|---|",
    ]
    for s in studies:
        none = s.per_superstep_ms["none"]
        for c in ("none", *STYLES):
            mine = s.per_superstep_ms[c]
            cells = [
                f"{s.regime} ({s.state_mb:.1f} MB)",
                c,
                med(mine, "{:.1f}"),
                med(s.checkpoint_ms[c], "{:.0f}"),
                med(s.write_ms[c], "{:.0f}"),
            ]
            if c == "none":
                out.append("| " + " | ".join(cells) + " | | | | |")
                continue
            cost = Interval.of([a / b for a, b in zip(mine, none, strict=True)])
            vs_blocking = Interval.of(
                [a / b for a, b in zip(mine, s.per_superstep_ms["blocking"], strict=True)]
            )
            pct = cost.shifted(-1.0, 100.0)
            cells += [
                pct.fmt(1, " %", signed=True),
                time_difference(cost).value,
            ]
            if c == "blocking":
                cells += ["", ""]
            else:
                cells += [
                    vs_blocking.shifted(-1.0, 100.0).fmt(1, " %", signed=True),
                    {"faster": "cheaper", "slower": "dearer"}.get(
                        time_difference(vs_blocking).value, "unresolved"
                    ),
                ]
            out.append("| " + " | ".join(cells) + " |")
    out.append(
        "\nSeed 004's Table 4 (overheads vs no fault tolerance): PageRank head +16.4 %, "
        "tail +11.9 %, blocking +34.6 %; connected components head +9.6 %, tail +2.7 %, "
        "blocking +18.8 %."
    )
    return "\n".join(out)


# -- 3. networkx -----------------------------------------------------------------------
def networkx_rate(n: int, edges: list[tuple[int, int]], clean: IterationRun, args: Any) -> str:
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from(edges)
    iterations = max(10, clean.supersteps)
    rates = []
    for _ in range(3):
        started = time.perf_counter()
        # tol 0 never converges: exactly ``iterations`` power iterations, then it raises
        with contextlib.suppress(nx.PowerIterationFailedConvergence):
            nx.pagerank(g, alpha=0.85, tol=0.0, max_iter=iterations)
        rates.append(iterations / (time.perf_counter() - started))
    ours = clean.supersteps / clean.progress.iterating_seconds
    return (
        f"PageRank on the same graph ({n:,} vertices, {len(edges):,} edges) in this run: "
        f"absflow (p = {args.table_p}, {args.launcher}) {ours:.1f} supersteps/s "
        f"({clean.supersteps} supersteps, checkpoints off); networkx.pagerank "
        f"{med(rates, '{:.1f}')} iterations/s (one process, median [min-max] of 3)."
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--launcher", choices=("local", "spark"), default="local")
    ap.add_argument("--vertices", type=int, default=1000)
    ap.add_argument("--edges", type=int, default=5000)
    ap.add_argument("--cc-vertices", type=int, default=2000)
    ap.add_argument("--cc-edges", type=int, default=4000, help="about; plus the trees")
    ap.add_argument("--tol", type=float, default=1e-8)
    ap.add_argument("--recovery-p", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--recovery-rounds", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=6, help="Table 4's interleaved rounds")
    ap.add_argument("--table-p", type=int, default=2)
    ap.add_argument("--table-supersteps", type=int, default=8)
    ap.add_argument("--ballast", type=int, default=2000, help="bytes per vertex; 0: none")
    ap.add_argument("--only", nargs="+", choices=("recovery", "table4", "networkx"), default=None)
    ap.add_argument(
        "--tag",
        default=None,
        help="the result file's entry for this run (default: the part, or all); a run of "
        "all parts replaces every entry",
    )
    ap.add_argument(
        "--regimes",
        nargs="+",
        choices=("plain", "ballast", "cc"),
        default=["plain", "ballast", "cc"],
        help="Table 4's iterations: PageRank, PageRank with --ballast, connected components",
    )
    args = ap.parse_args(argv)
    started = time.perf_counter()
    n = args.vertices
    edges = power_law_digraph(n, args.edges, seed=1)
    cn = args.cc_vertices
    n_components = max(1, cn // 20)
    tree = cn - n_components
    extra = max(0.0, (args.cc_edges - tree) / max(1, tree))
    cc_edges = components_graph(cn, n_components, extra_edges=extra, seed=2)
    parts: list[str] = []
    if args.only is None or "recovery" in args.only:
        rows, shape = recovery_study(
            "PageRank",
            lambda p: pagerank(n, edges, p, args.tol),
            pagerank_check,
            args.recovery_p,
            args,
        )
        parts.append(recovery_table(rows, shape, f"PageRank ({n:,} v / {len(edges):,} e)"))
        report(parts, args, argv, started)
        rows, shape = recovery_study(
            "Connected components",
            lambda p: components(cn, cc_edges, p),
            cc_check,
            args.recovery_p,
            args,
        )
        ref = union_find_labels(cn, cc_edges)
        assert cc_check(components_result(cn, cc_edges, args), ref) == "exact", "CC is wrong"
        parts.append(
            recovery_table(
                rows, shape, f"Connected components (delta, {cn:,} v / {len(cc_edges):,} e)"
            )
        )
        report(parts, args, argv, started)
    if args.only is None or "table4" in args.only:
        fixed = {"max_supersteps": args.table_supersteps}
        studies = []
        if "plain" in args.regimes:
            plain = pagerank(n, edges, args.table_p, 0.0, **fixed)
            studies.append(cost_study("PageRank", plain, args))
        if "ballast" in args.regimes and args.ballast:
            big = pagerank(n, edges, args.table_p, 0.0, ballast=args.ballast, **fixed)
            studies.append(cost_study(f"PageRank +{args.ballast} B/vertex", big, args))
        if "cc" in args.regimes:
            cc = components(cn, cc_edges, args.table_p)
            studies.append(cost_study("CC (delta)", cc, args))
        parts.append(cost_table(studies, args))
        report(parts, args, argv, started)
    if args.only is None or "networkx" in args.only:
        clean = run(pagerank(n, edges, args.table_p, args.tol), "none", 1, None, args)
        assert isinstance(clean, IterationRun)
        parts.append(networkx_rate(n, edges, clean, args))
    report(parts, args, argv, started, final=True)
    return 0


def report(
    parts: list[str], args: Any, argv: list[str] | None, started: float, final: bool = False
) -> None:
    """Print the tables so far and write them to the result file (after every part: a run
    stopped midway keeps what it measured). The file keeps one entry per ``--tag`` (the
    part run, by default), each with its own command, launcher, commit and date, so the
    parts may be measured by separate runs (Table 4 on Spark, the recovery figures at
    another size) and read together."""
    command = " ".join(
        ["python benchmarks/iterations.py", *(argv if argv is not None else sys.argv[1:])]
    )
    seconds = time.perf_counter() - started
    header = f"Measured by `{command}` ({args.launcher} launcher, {seconds:.0f} s in all)."
    print("\n\n".join([header, *parts]) + "\n", flush=True)
    if final:
        print("Table 4 at the recorded size:\n  " + FULL_SIZE)
    tag = args.tag or ("+".join(args.only) if args.only else "all")
    entries = {} if tag == "all" else previous_entries()
    entries.pop("all", None)
    entries[tag] = {
        "command": command,
        "launcher": args.launcher,
        "seconds": round(seconds, 1),
        "tables": parts,
        "commit": tree_commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_result(
        "iterations",
        {"parts": entries},
        rounds=args.rounds,
        argv=sys.argv if argv is None else [sys.argv[0], *argv],
    )


def previous_entries() -> dict[str, Any]:
    """The parts an earlier run recorded (none if the file is missing or of the old form)."""
    path = RESULTS_DIR / "iterations.json"
    try:
        parts = json.loads(path.read_text(encoding="utf-8"))["figures"]["parts"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return dict(parts) if isinstance(parts, dict) else {}


FULL_SIZE = (
    "python benchmarks/iterations.py --launcher spark --only table4 networkx --vertices 100000 "
    "--edges 1000000 --cc-vertices 100000 --cc-edges 1000000 --rounds 6 --table-supersteps 5 "
    "--ballast 3000 --tag table4-spark"
)


def components_result(n: int, edges: list[tuple[int, int]], args: Any) -> dict[int, int]:
    got = run(components(n, edges, args.table_p), "none", 1, None, args)
    assert isinstance(got, IterationRun)
    return got.solution


if __name__ == "__main__":
    sys.exit(main())
