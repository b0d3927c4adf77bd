"""Start-up and recovery on a Spark standalone cluster beside local mode, in one run.

    python benchmarks/cluster.py [--n 400000] [--rate 200000] [--repeat 3]

Starts a standalone cluster on 127.0.0.1 (a master and two workers of 2 slots each, as
the test suite does), then submits the same driver with ``python -m jobmanager submit``
to ``local[6]`` and to the standalone master, interleaved, ``--repeat`` times. Each
driver runs a keyed running count (N records at a limited rate, parallelism 2, a
checkpoint every 0.2 s) twice on its session:

* **cold**: the session's first job (the executors start their Python workers);
* **kill**: a second job with a SIGKILL of ``count[1]`` right after checkpoint 2.

Printed per master (median over the repeats): launch (``python -m jobmanager submit``
started) -> first record; start-up (barrier stage submitted -> first record) of the cold
and of the second job; recovery kill -> processing again; whether both results were
exact. The figures come from ``JobResult`` (``startup_seconds``,
``restarts[i].recovery_seconds``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

VOCAB = 1000


def word(i: int) -> str:
    return f"w{(i * 7919) % VOCAB}"


def run_job(n: int, rate: float, checkpoint_dir: str, kill: bool) -> dict[str, Any]:
    """One keyed count on the session spark-submit configured; its figures."""
    from jobmanager.faults import Kill
    from runtime import Dataflow
    from runtime.sources import GeneratorSource

    flow = Dataflow(
        "cluster_bench",
        parallelism=2,
        checkpoint_interval=0.2,
        checkpoint_dir=checkpoint_dir,
        progress=False,
    )
    (
        flow.source(GeneratorSource(word, n, rate=rate), name="words")
        .key_by(lambda w: w)
        .aggregate(0, lambda c, _w: c + 1, name="count")
        .collect("out")
    )
    result = flow.run(faults=[Kill("count[1]", after_checkpoint=2)] if kill else [])
    last: dict[str, int] = {}
    for k, c in result.output("out"):
        last[k] = max(last.get(k, 0), c)
    firsts = [
        m["first_record_at"] for m in result.task_metrics.values() if m.get("first_record_at")
    ]
    return {
        "first_record_wall": min(firsts, default=None),
        "startup": result.startup_seconds,
        "recovery": [r.recovery_seconds for r in result.restarts],
        "exact": len(result.output("out")) == n and sum(last.values()) == n,
        "unfired": result.unfired_faults,
    }


def driver(out: str, checkpoint_dir: str, n: int, rate: float, launched: float) -> None:
    """The submitted side: a cold job, then one with a kill; figures to ``out``."""
    cold = run_job(n, rate, os.path.join(checkpoint_dir, "cold"), kill=False)
    killed = run_job(n, rate, os.path.join(checkpoint_dir, "kill"), kill=True)
    first = cold["first_record_wall"]
    cold["launch"] = None if first is None else first - launched
    Path(out).write_text(json.dumps({"cold": cold, "kill": killed}))


def submit(master: str, work: Path, n: int, rate: float, env: dict[str, str]) -> dict[str, Any]:
    out = work / "figures.json"
    argv = [sys.executable, "-m", "jobmanager", "submit", "--master", master]
    argv += ["--out", str(work / "dist"), "--conf", "spark.ui.enabled=false"]
    argv += [os.path.abspath(__file__), "--driver", str(out), str(work / "chk"), str(n), str(rate)]
    argv += [repr(time.time())]  # python -m jobmanager submit starts now
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or not out.exists():
        raise SystemExit(f"{master}: the driver failed\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    figures: dict[str, Any] = json.loads(out.read_text())
    return figures


def median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s" if values else "-"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=400_000)
    ap.add_argument("--rate", type=float, default=200_000.0, help="records/s of the source")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--driver", nargs=5, metavar=("OUT", "CHK", "N", "RATE", "T0"), help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    if args.driver:
        out, chk, n, rate, launched = args.driver
        driver(out, chk, int(n), float(rate), float(launched))
        return

    from tests.integration.standalone import StandaloneCluster

    with tempfile.TemporaryDirectory(prefix="absflow-bench-cluster-") as tmp:
        print("starting a standalone cluster (a master, two workers of 2 slots) ...", flush=True)
        cluster = StandaloneCluster(Path(tmp, "cluster"), workers=2, cores=2).start()
        env = {k: v for k, v in cluster.env().items() if k != "PYTHONPATH"}
        env["PYSPARK_PYTHON"] = sys.executable
        runs: dict[str, list[dict[str, Any]]] = {"local[6]": [], cluster.url: []}
        try:
            for rep in range(args.repeat):
                for master, figures in runs.items():
                    kind = "standalone" if master.startswith("spark://") else "local"
                    work = Path(tmp, f"{kind}-{len(figures)}")  # Spark refuses [ ] in paths
                    figures.append(submit(master, work, args.n, args.rate, env))
                    f = figures[-1]
                    print(
                        f"  round {rep + 1}/{args.repeat} {master}: launch -> first record "
                        f"{f['cold']['launch']:.2f} s, start-up cold {f['cold']['startup']:.2f} s, "
                        f"second job {f['kill']['startup']:.2f} s, recovery "
                        + ", ".join(f"{r:.2f} s" for r in f["kill"]["recovery"] if r is not None),
                        flush=True,
                    )
        finally:
            cluster.stop()
            left = cluster.leftovers()
    print(f"\n== keyed count, {args.n:,} records at {args.rate:,.0f}/s, parallelism 2 (4 tasks) ==")
    print(
        f"{'master':<24} {'launch->1st':>12} {'start-up cold':>14} {'start-up 2nd':>13} "
        f"{'recovery':>9} {'exact':>6}"
    )
    for master, figures in runs.items():
        launch = [f["cold"]["launch"] for f in figures if f["cold"]["launch"] is not None]
        cold = [f["cold"]["startup"] for f in figures if f["cold"]["startup"] is not None]
        warm = [f["kill"]["startup"] for f in figures if f["kill"]["startup"] is not None]
        rec = [r for f in figures for r in f["kill"]["recovery"] if r is not None]
        exact = all(f["cold"]["exact"] and f["kill"]["exact"] for f in figures)
        name = "standalone (2 workers)" if master.startswith("spark://") else master
        print(
            f"{name:<24} {median(launch):>12} {median(cold):>14} {median(warm):>13} "
            f"{median(rec):>9} {exact!s:>6}"
        )
    unfired = [u for fs in runs.values() for f in fs for u in f["kill"]["unfired"]]
    if unfired:
        print(f"note: kills that did not fire (the job ended first): {unfired}")
    print(
        "launch->1st: python -m jobmanager submit started -> first record (JVMs, executors);\n"
        "start-up: barrier stage submitted -> first record; recovery: SIGKILL of count[1] -> "
        "processing again (restored from the latest checkpoint)"
    )
    if left:
        print(f"warning: cluster processes left: {left}")


if __name__ == "__main__":
    main()
