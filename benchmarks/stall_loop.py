"""Run the main example again and again; catch a run that stalls, with stacks.

    python benchmarks/stall_loop.py [--runs 200] [--factor 3] [-- examples/wordcount.py ARGS]

Each run is the README's main job (``python examples/wordcount.py`` unless a command
follows ``--``), started in a session of its own. A run's **job time** is from the
driver's "dashboard at" line (the job submitted, Spark up) to its exit: Spark's start-up,
which varies with the machine's load far more than the job, is left out. Once
``--min-runs`` runs finished, a run whose job time passes ``--factor`` times the median
job time of the finished runs is a **stall**: at that moment every Python process of its
session (the driver and every task) gets a ``py-spy dump`` (the stacks of all its
threads), saved with the run's stderr so far under ``--dumps``; the run is then left to
finish (or killed after ``--give-up`` times the median, which counts as a stall too). A
run whose own summary shows a checkpoint median duration past ``--factor`` times the
runs' median is a stall as well (the stall seen before: every checkpoint aligning for
seconds), found after the run. Prints every run and, at the end, stalls per 100 runs and
the job times' median, p95 and max; writes ``benchmarks/results/stall_loop.json``. Needs
py-spy (``pip install -e '.[bench]'``) and the right to ptrace the runs (root, or
``kernel.yama.ptrace_scope`` 0).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from results import write_result  # noqa: E402


def session_pythons(sid: int) -> list[int]:
    """The pids of the Python processes of session ``sid`` (a run and all it started)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0", 1)[0]
        except OSError:
            continue
        if int(fields[3]) == sid and b"python" in os.path.basename(argv0):
            found.append(int(entry))
    return sorted(found)


def dump_stacks(pids: list[int], py_spy: str) -> str:
    parts = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        done = subprocess.run(
            [py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60
        )
        parts.append(f"===== pid {pid}: {argv}\n{done.stdout}{done.stderr}")
    return "\n".join(parts)


@dataclass
class Run:
    seconds: float  # the whole run
    job_seconds: float | None  # from the "dashboard at" line to the exit
    checkpoint_ms: float | None  # the run's median checkpoint duration (its summary)
    stalled: bool
    code: int


class Lines(threading.Thread):
    """A run's stream, line by line (also into ``sink``); notes when a line with ``mark``
    came."""

    def __init__(self, stream: IO[str], sink: IO[str] | None = None, mark: str = "") -> None:
        super().__init__(daemon=True)
        self.stream, self.sink, self.mark = stream, sink, mark
        self.marked_at: float | None = None
        self.lines: list[str] = []

    def run(self) -> None:
        for line in self.stream:
            if self.mark and self.marked_at is None and self.mark in line:
                self.marked_at = time.monotonic()
            self.lines.append(line)
            if self.sink is not None:
                self.sink.write(line)
                self.sink.flush()


CHECKPOINTS = re.compile(r"checkpoints: .*median duration ([0-9.]+) ms")


def one_run(
    command: list[str], median: float | None, args: argparse.Namespace, dumps: Path, n: int
) -> Run:
    with tempfile.NamedTemporaryFile("w+", suffix=".err") as err:
        started = time.monotonic()
        proc = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": REPO},
        )
        assert proc.stdout is not None and proc.stderr is not None
        errors = Lines(proc.stderr, err, "dashboard at")
        output = Lines(proc.stdout)
        errors.start()
        output.start()
        stalled = False
        try:
            while proc.poll() is None:
                submitted = errors.marked_at
                job = time.monotonic() - submitted if submitted is not None else 0.0
                if median is not None and not stalled and job > args.factor * median:
                    stalled = True
                    stacks = dump_stacks(session_pythons(proc.pid), args.py_spy)
                    path = dumps / f"run-{n:04d}.txt"
                    path.write_text(
                        f"run {n}: job time {job:.1f} s, median {median:.1f} s\n\n"
                        f"{stacks}\n===== stderr so far\n{''.join(errors.lines)[-20000:]}"
                    )
                    print(f"  run {n} stalls at {job:.1f} s: stacks in {path}", flush=True)
                if median is not None and job > args.give_up * median:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    break
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        ended = time.monotonic()
        errors.join(10)
        output.join(10)
        found = CHECKPOINTS.search("".join(output.lines))
        submitted = errors.marked_at
        return Run(
            seconds=ended - started,
            job_seconds=ended - submitted if submitted is not None else None,
            checkpoint_ms=float(found.group(1)) if found else None,
            stalled=stalled,
            code=proc.returncode,
        )


def main() -> int:
    argv = sys.argv[1:]
    command_args = argv[argv.index("--") + 1 :] if "--" in argv else ["examples/wordcount.py"]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--factor", type=float, default=3.0)
    ap.add_argument("--give-up", type=float, default=10.0, dest="give_up")
    ap.add_argument("--min-runs", type=int, default=5, dest="min_runs")
    ap.add_argument("--dumps", default=os.path.join(REPO, "tmp", "stalls"))
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    args.py_spy = shutil.which("py-spy")
    if args.py_spy is None:
        raise SystemExit("py-spy is not installed: pip install -e '.[bench]'")
    dumps = Path(args.dumps)
    dumps.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, *command_args]
    runs: list[Run] = []
    for n in range(1, args.runs + 1):
        ordinary = [r.job_seconds for r in runs if not r.stalled and r.job_seconds is not None]
        median = statistics.median(ordinary) if len(ordinary) >= args.min_runs else None
        run = one_run(command, median, args, dumps, n)
        usual_ms = [r.checkpoint_ms for r in runs if not r.stalled and r.checkpoint_ms]
        if (
            len(usual_ms) >= args.min_runs
            and run.checkpoint_ms is not None
            and run.checkpoint_ms > args.factor * statistics.median(usual_ms)
        ):
            run.stalled = True  # found after the run: no stacks, its stderr is kept
            print(f"  run {n}: checkpoint median {run.checkpoint_ms:.0f} ms", flush=True)
        runs.append(run)
        job = f"{run.job_seconds:.1f} s" if run.job_seconds is not None else "never submitted"
        print(
            f"run {n}: {run.seconds:.1f} s, job {job}, checkpoints {run.checkpoint_ms} ms, "
            f"exit {run.code}{'  STALL' if run.stalled else ''}",
            flush=True,
        )
    stalls = sum(r.stalled for r in runs)
    failures = sum(r.code != 0 for r in runs)
    jobs = sorted(r.job_seconds for r in runs if not r.stalled and r.job_seconds is not None)
    p95 = jobs[min(len(jobs) - 1, int(0.95 * len(jobs)))] if jobs else 0.0
    per_100 = 100 * stalls / args.runs
    print(
        f"{stalls} stall(s) in {args.runs} runs ({per_100:.1f} per 100), {failures} failed; "
        f"job time median {statistics.median(jobs) if jobs else 0:.1f} s, p95 {p95:.1f} s, "
        f"max {max(jobs, default=0):.1f} s ({' '.join(command_args)})"
    )
    write_result(
        "stall_loop",
        {
            "command": " ".join(["python", *command_args]),
            "runs": args.runs,
            "stalls": stalls,
            "stalls_per_100": round(per_100, 2),
            "failures": failures,
            "factor": args.factor,
            "job_median_s": round(statistics.median(jobs), 2) if jobs else None,
            "job_p95_s": round(p95, 2),
            "job_max_s": round(max(jobs, default=0), 2),
            "run_median_s": round(statistics.median(r.seconds for r in runs), 2),
            "checkpoint_median_ms": [r.checkpoint_ms for r in runs],
            "stalled_runs": [n + 1 for n, r in enumerate(runs) if r.stalled],
        },
        rounds=args.runs,
    )
    return 0 if stalls == 0 and failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
