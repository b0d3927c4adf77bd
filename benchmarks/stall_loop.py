"""Run the main example again and again; catch a run that stalls, with stacks.

    python benchmarks/stall_loop.py [--runs 200] [--factor 3] [-- examples/wordcount.py ARGS]

Each run is the README's main job (``python examples/wordcount.py`` unless a command
follows ``--``), started in a session of its own. Once ``--min-runs`` runs finished, a
run that passes ``--factor`` times the median of the finished runs' times is a
**stall**: at that moment every Python process of its session (the driver and every
task) gets a ``py-spy dump`` (the stacks of all its threads), saved with the run's
stderr so far under ``--dumps``; the run is then left to finish (or killed after
``--give-up`` times the median, which counts as a stall too). Prints every run and, at
the end, stalls per 100 runs and the run times' median, p95 and max; writes
``benchmarks/results/stall_loop.json``. Needs py-spy (``pip install -e '.[bench]'``) and
the right to ptrace the runs (root, or ``kernel.yama.ptrace_scope`` 0).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


def one_run(
    command: list[str], median: float | None, args: argparse.Namespace, dumps: Path, n: int
) -> tuple[float, bool, int]:
    """(seconds, stalled, exit code) of one run."""
    with tempfile.TemporaryFile("w+") as err:
        started = time.monotonic()
        proc = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": REPO},
        )
        stalled = False
        try:
            while proc.poll() is None:
                elapsed = time.monotonic() - started
                if median is not None and not stalled and elapsed > args.factor * median:
                    stalled = True
                    stacks = dump_stacks(session_pythons(proc.pid), args.py_spy)
                    err.flush()
                    err.seek(0)
                    path = dumps / f"run-{n:04d}.txt"
                    path.write_text(
                        f"run {n}: {elapsed:.1f} s, median {median:.1f} s\n\n"
                        f"{stacks}\n===== stderr so far\n{err.read()[-20000:]}"
                    )
                    err.seek(0, os.SEEK_END)
                    print(f"  run {n} stalls at {elapsed:.1f} s: stacks in {path}", flush=True)
                if median is not None and elapsed > args.give_up * median:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    break
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        return time.monotonic() - started, stalled, proc.returncode


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
    times: list[float] = []
    stalls, failures = 0, 0
    for n in range(1, args.runs + 1):
        median = statistics.median(times) if len(times) >= args.min_runs else None
        seconds, stalled, code = one_run(command, median, args, dumps, n)
        stalls += stalled
        failures += code != 0
        if not stalled:  # the median is of ordinary runs
            times.append(seconds)
        print(f"run {n}: {seconds:.1f} s, exit {code}{'  STALL' if stalled else ''}", flush=True)
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] if ordered else 0.0
    per_100 = 100 * stalls / args.runs
    print(
        f"{stalls} stall(s) in {args.runs} runs ({per_100:.1f} per 100), {failures} failed; "
        f"run time median {statistics.median(times) if times else 0:.1f} s, p95 {p95:.1f} s, "
        f"max {max(times, default=0):.1f} s ({' '.join(command_args)})"
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
            "median_s": round(statistics.median(times), 2) if times else None,
            "p95_s": round(p95, 2),
            "max_s": round(max(times, default=0), 2),
        },
        rounds=args.runs,
    )
    return 0 if stalls == 0 and failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
