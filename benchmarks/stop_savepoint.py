"""Time from SIGTERM to the driver's exit with a savepoint.

    python benchmarks/stop_savepoint.py [--runs 3] [--rate 20000] [--keys 1000]

Each run starts a driver (this file with ``--driver``) running an unbounded keyed count
(GeneratorSource with count=None at ``--rate`` records/s, parallelism 2, checkpoints
every 0.5 s), waits until its second checkpoint completed, sends it SIGTERM and measures
until the process exited (exit code 0, a savepoint in its checkpoint root). Prints each
run and the median: this is the time a deployment's stop takes, start-up excluded.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def driver(checkpoint_dir: str, rate: float, keys: int) -> int:
    from runtime import Dataflow
    from runtime.sources import GeneratorSource

    flow = Dataflow(
        "stop-bench", parallelism=2, checkpoint_interval=0.5, checkpoint_dir=checkpoint_dir
    )
    (
        flow.source(GeneratorSource(lambda i: i % keys, None, rate=rate), name="numbers")
        .key_by(lambda k: k)
        .aggregate(0, lambda c, _k: c + 1, name="count")
        .filter(lambda kv: kv[1] % 1000 == 0, name="every_1000th")
        .collect("out")
    )
    result = flow.run(progress=False)
    print(f"stopped: {result.stopped}; savepoint {result.savepoint}", flush=True)
    return 0


def one_run(rate: float, keys: int) -> tuple[float, str]:
    with tempfile.TemporaryDirectory(prefix="stop-bench-") as tmp:
        chk = Path(tmp) / "chk"
        proc = subprocess.Popen(
            [sys.executable, __file__, "--driver", str(chk), str(rate), str(keys)],
            env={**os.environ, "PYTHONPATH": REPO},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 300
            while len(list(chk.glob("chk-*/_metadata"))) < 2:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(
                        f"the driver did not checkpoint: {proc.communicate()[1][-2000:]}"
                    )
                time.sleep(0.02)
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=300)
            seconds = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc.returncode != 0:
            raise SystemExit(f"the driver exited {proc.returncode}: {err[-2000:]}")
        savepoint = next((line for line in out.splitlines() if "savepoint" in line), "?")
        return seconds, savepoint.strip()


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--driver":
        return driver(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]))
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rate", type=float, default=20_000)
    ap.add_argument("--keys", type=int, default=1_000)
    args = ap.parse_args()
    times = []
    for i in range(args.runs):
        seconds, savepoint = one_run(args.rate, args.keys)
        times.append(seconds)
        print(f"run {i + 1}: SIGTERM -> exit {seconds:.2f} s ({savepoint})", flush=True)
    print(
        f"SIGTERM -> exit with a savepoint: median {statistics.median(times):.2f} s "
        f"(min {min(times):.2f}, max {max(times):.2f}) over {len(times)} run(s), p=2, "
        f"{args.rate:,.0f} records/s, {args.keys} keys"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
