"""A long run, sampled from outside: does anything grow that should stay flat?

    python benchmarks/soak.py [--minutes 30] [--rate 100000] [--keys 10000] [--launcher spark]

Starts a driver (this file with ``--driver``) running an unbounded job with keyed state,
event-time windows and an exactly-once sink: a GeneratorSource at ``--rate`` records/s
(p = 2), a keyed running count, a tumbling event-time window count per key, into a
ParquetSink (two-phase commit), checkpoints every second. The rate is more than the job
takes on this machine, so the sources read as fast as backpressure lets them, as behind
a backlog; their watermarks are aligned (``max_drift``: three windows of event time),
without which one source subtask drifts ahead and the windows' state grows with the
drift (docs/event-time.md, "Watermark alignment"). Every ``--every`` seconds it
samples, through the job's REST API and /proc: each task's RSS and open file
descriptors, the checkpoint durations completed since the last sample, the files under
the checkpoint root, and the records read per second. After ``--minutes`` it sends the
driver SIGTERM (stop with a savepoint) and times the stop.

Then it prints, per series, the median of the first and of the last third of the run
after a warm-up (``--warmup`` minutes, at most a fifth of the run),
the least-squares slope over the run (per 10 minutes) and a verdict: **flat** when the
last third's median is within ``--tolerance`` (default 20 %) plus a small absolute
allowance of the first third's, else **grows**. It draws the series into a PNG
(``--plot``, needs matplotlib) and writes its figures to ``benchmarks/results/soak.json``.
Exit code 0 when every series stayed flat and the stop left a savepoint, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from results import write_result  # noqa: E402

WINDOW_MS = 10_000


def _key(i: int, keys: int) -> tuple[int, int]:
    return (i * 7919) % keys, i  # (key, event time in ms: one record per ms of event time)


def driver(out_dir: str, checkpoint_dir: str, rate: float, keys: int, port: int) -> int:
    from runtime import Dataflow
    from runtime.connectors.parquet import ParquetSink
    from runtime.sources import GeneratorSource
    from runtime.window_kinds import Tumbling

    flow = Dataflow(
        "soak",
        parallelism=2,
        checkpoint_interval=1.0,
        checkpoint_dir=checkpoint_dir,
        ui_port=port,
        progress=False,
    )
    events = flow.source(
        GeneratorSource(lambda i: _key(i, keys), None, rate=rate), name="events"
    ).assign_timestamps(lambda r: r[1], max_delay=1_000, max_drift=3 * WINDOW_MS)
    keyed = events.key_by(lambda r: r[0])
    counts = keyed.aggregate(0, lambda c, _r: c + 1, name="running_count")
    counts.filter(lambda kv: kv[1] % 100_000 == 0, name="milestones").collect("milestones_out")
    (
        keyed.window(Tumbling(WINDOW_MS), name="per_window")
        .count()
        .map(lambda w: {"key": w[0], "start": w[1], "end": w[2], "n": w[3]}, name="rows")
        .sink(ParquetSink(out_dir, roll_interval_s=60.0), name="parquet")
    )
    result = flow.run()
    print(f"stopped: {result.stopped}; savepoint {result.savepoint}", flush=True)
    return 0


@dataclass
class Series:
    name: str
    unit: str
    points: list[tuple[float, float]] = field(default_factory=list)  # (minutes, value)
    allowance: float = 0.0  # absolute slack added to the tolerance

    def add(self, minute: float, value: float) -> None:
        self.points.append((minute, value))

    def after(self, warmup: float) -> list[tuple[float, float]]:
        """The points after the warm-up (start-up, the first checkpoints, JIT-less caches)."""
        return [p for p in self.points if p[0] >= warmup] or self.points[-1:]

    def thirds(self, warmup: float) -> tuple[float, float]:
        points = self.after(warmup)
        n = len(points)
        third = max(1, n // 3)
        first = statistics.median(v for _, v in points[:third])
        last = statistics.median(v for _, v in points[n - third :])
        return first, last

    def slope_per_10min(self, warmup: float) -> float:
        points = self.after(warmup)
        if len(points) < 2:
            return 0.0
        xs, ys = zip(*points, strict=True)
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        var = sum((x - mx) ** 2 for x in xs)
        return (
            10 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
        )

    def flat(self, tolerance: float, warmup: float) -> bool:
        first, last = self.thirds(warmup)
        return last <= first * (1 + tolerance) + self.allowance


def _get(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/{path}", timeout=5) as answer:
        return json.loads(answer.read())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def _files_under(root: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(root))


def _job_id(port: int, proc: subprocess.Popen[str], deadline: float) -> str:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(
                f"the driver exited {proc.returncode}: {proc.communicate()[1][-3000:]}"
            )
        try:
            jobs = _get(port, "jobs")["jobs"]
            running = [j for j in jobs if j.get("state") == "running"]
            if running:
                return str(running[0]["id"])
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("the job did not start running within the start-up deadline")


@dataclass
class Sampler:
    port: int
    job: str
    checkpoint_root: Path
    rss = Series("task RSS (max over tasks)", "MiB", allowance=16)
    fds = Series("open descriptors (sum over tasks)", "fds", allowance=8)
    ckpt = Series("checkpoint duration (median of the interval)", "ms", allowance=100)
    files = Series("files under the checkpoint root", "files", allowance=20)
    rate = Series("records read per second", "rec/s")
    last_ckpt: int = 0
    last_records: float = 0.0
    last_at: float = 0.0
    checkpoints: int = 0

    def sample(self, minute: float) -> None:
        tasks = _get(self.port, f"tasks?job={self.job}")["tasks"]
        pids = [int(t["pid"]) for t in tasks if t.get("pid")]
        if tasks:
            self.rss.add(minute, max(t.get("rss_bytes", 0) for t in tasks) / 2**20)
        self.fds.add(minute, sum(_open_fds(pid) for pid in pids))
        done = _get(self.port, f"checkpoints?job={self.job}&since={self.last_ckpt}&limit=1000")
        completed = [c for c in done.get("completed", []) if c["checkpoint_id"] > self.last_ckpt]
        durations = [c["duration_ms"] for c in completed]
        if durations:
            self.ckpt.add(minute, statistics.median(durations))
            self.last_ckpt = max(c["checkpoint_id"] for c in completed)
            self.checkpoints += len(durations)
        self.files.add(minute, _files_under(self.checkpoint_root))
        records = float(_get(self.port, f"metrics?job={self.job}").get("records_in", 0))
        now = time.monotonic()
        if self.last_at:
            self.rate.add(minute, (records - self.last_records) / (now - self.last_at))
        self.last_records, self.last_at = records, now

    @property
    def series(self) -> list[Series]:
        return [self.rss, self.fds, self.ckpt, self.files, self.rate]


def plot(path: str, series: list[Series]) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(len(series), 1, figsize=(8, 2.2 * len(series)), sharex=True)
    for ax, s in zip(axes, series, strict=True):
        if s.points:
            xs, ys = zip(*s.points, strict=True)
            ax.plot(xs, ys, linewidth=1)
        ax.set_ylabel(s.unit)
        ax.set_title(s.name, fontsize=9)
        ax.set_ylim(bottom=0)
    axes[-1].set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return True


def soak(args: argparse.Namespace) -> int:
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="absflow-soak-") as tmp:
        chk, out = Path(tmp) / "chk", Path(tmp) / "out"
        cmd = [sys.executable, __file__, "--driver", str(out), str(chk), str(args.rate)]
        proc = subprocess.Popen(
            [*cmd, str(args.keys), str(port)],
            env={**os.environ, "PYTHONPATH": REPO, "ABSFLOW_LAUNCHER": args.launcher},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            sampler = Sampler(port, _job_id(port, proc, time.monotonic() + 300), chk)
            started = time.monotonic()
            end = started + args.minutes * 60
            while time.monotonic() < end:
                if proc.poll() is not None:
                    raise SystemExit(f"the driver exited: {proc.communicate()[1][-3000:]}")
                sampler.sample((time.monotonic() - started) / 60)
                time.sleep(min(args.every, max(0.0, end - time.monotonic())))
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            stdout, stderr = proc.communicate(timeout=600)
            stop_s = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        savepoint = next((line for line in stdout.splitlines() if "savepoint" in line), "")
        saved = proc.returncode == 0 and "savepoint None" not in savepoint
    print(
        f"soak: {args.minutes} min at {args.rate:,.0f} rec/s, {args.keys:,} keys, p=2, "
        f"{args.launcher} launcher, {sampler.checkpoints} checkpoints"
    )
    warmup = min(args.warmup, args.minutes / 5)
    verdicts: dict[str, Any] = {}
    for s in sampler.series:
        first, last = s.thirds(warmup)
        slope = s.slope_per_10min(warmup)
        if s is sampler.rate:  # throughput must not fall
            flat = last >= first * (1 - args.tolerance)
        else:
            flat = s.flat(args.tolerance, warmup)
        verdicts[s.name] = {
            "first_third": round(first, 2),
            "last_third": round(last, 2),
            "slope_per_10min": round(slope, 3),
            "unit": s.unit,
            "flat": flat,
        }
        print(
            f"  {s.name:48s} first third {first:10.1f} {s.unit:6s} last third {last:10.1f}"
            f"  slope {slope:+9.2f}/10 min  {'flat' if flat else 'GROWS'}"
        )
    print(
        f"  stop with a savepoint: {stop_s:.1f} s, {'saved' if saved else 'NO SAVEPOINT'} "
        f"({savepoint.strip() or stderr[-500:]})"
    )
    if args.plot and plot(args.plot, sampler.series):
        print(f"  plot: {args.plot}")
    write_result(
        "soak",
        {
            "minutes": args.minutes,
            "warmup_minutes": warmup,
            "rate": args.rate,
            "keys": args.keys,
            "launcher": args.launcher,
            "checkpoints": sampler.checkpoints,
            "series": verdicts,
            "stop_seconds": round(stop_s, 2),
            "savepoint": saved,
        },
        rounds=1,
    )
    return 0 if saved and all(v["flat"] for v in verdicts.values()) else 1


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--driver":
        _, _, out, chk, rate, keys, port = sys.argv
        return driver(out, chk, float(rate), int(keys), int(port))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--rate", type=float, default=100_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--tolerance", type=float, default=0.2)
    ap.add_argument(
        "--warmup", type=float, default=2.0, help="minutes left out of the verdicts (at most 1/5)"
    )
    ap.add_argument("--launcher", choices=("spark", "local"), default="spark")
    ap.add_argument("--plot", default=os.path.join(REPO, "docs", "soak.png"))
    return soak(ap.parse_args())


if __name__ == "__main__":
    sys.exit(main())
