"""Bytewax peer of benchmarks/windows.py: the same windowed counts in bytewax 0.21.

Run from bytewax's own venv (never a dependency of ours), e.g.

    ../bytewax-venv/bin/python benchmarks/peers/bytewax_windows.py --n 1000000 --kind session

Input: record i = (f"k{(i*7919) % 10000}", i // 10 + (i*104729) % 500) (key, ms), from a
FixedPartitionedSource of 2 partitions (resume state snapshotted); key_on(key) ->
count_window with an EventClock (500 ms wait for late data) and a TumblingWindower
(60 s) or SessionWindower (3 s gap); a sink sums the window counts (must equal N).
2 processes, 1 worker each; with --interval-s > 0, SQLite recovery snapshots at that
epoch interval. Prints one JSON line prefixed "RESULT ".
"""

import argparse
import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

KEYS = 10_000
BATCH = 1000
EPOCH0 = datetime(2024, 1, 1, tzinfo=UTC)


def record(i):
    return (f"k{(i * 7919) % KEYS}", i // 10 + (i * 104_729) % 500)


def build_flow(n, kind, outdir):
    import bytewax.operators as op
    import bytewax.operators.windowing as win
    from bytewax.dataflow import Dataflow
    from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
    from bytewax.outputs import DynamicSink, StatelessSinkPartition

    class _Part(StatefulSourcePartition):
        def __init__(self, start, step, n):
            self.i, self.step, self.n = start, step, n

        def next_batch(self):
            if self.i >= self.n:
                raise StopIteration()
            idx = range(self.i, min(self.n, self.i + BATCH * self.step), self.step)
            self.i += len(idx) * self.step
            return [record(j) for j in idx]

        def snapshot(self):
            return self.i

    class Source(FixedPartitionedSource):
        def list_parts(self):
            return ["0", "1"]

        def build_part(self, step_id, for_part, resume_state):
            p = int(for_part)
            return _Part(p if resume_state is None else resume_state, 2, n)

    class _SinkPart(StatelessSinkPartition):
        def __init__(self, path):
            self.path, self.windows, self.total = path, 0, 0

        def write_batch(self, items):
            for _key, (_wid, count) in items:
                self.windows += 1
                self.total += count

        def close(self):
            with open(self.path, "w") as f:
                json.dump({"windows": self.windows, "total": self.total}, f)

    class Sink(DynamicSink):
        def build(self, step_id, worker_index, worker_count):
            return _SinkPart(os.path.join(outdir, f"sink-{worker_index}-{os.getpid()}.json"))

    clock = win.EventClock(
        lambda r: EPOCH0 + timedelta(milliseconds=r[1]),
        wait_for_system_duration=timedelta(milliseconds=500),
    )
    if kind == "session":
        windower = win.SessionWindower(gap=timedelta(seconds=3))
    else:
        windower = win.TumblingWindower(length=timedelta(seconds=60), align_to=EPOCH0)
    flow = Dataflow("windows")
    events = op.input("inp", flow, Source())
    counted = win.count_window("count", events, clock, windower, lambda r: r[0])
    op.output("out", counted.down, Sink())
    return flow


def worker_main(args):
    from bytewax._bytewax import cli_main
    from bytewax.recovery import RecoveryConfig

    flow = build_flow(args.n, args.kind, args.outdir)
    rc = RecoveryConfig(Path(args.recovery_dir)) if args.recovery_dir else None
    epoch = timedelta(seconds=args.interval_s) if args.interval_s > 0 else None
    cli_main(
        flow,
        workers_per_process=1,
        process_id=args.proc_id,
        addresses=args.addresses.split(";") if args.addresses else None,
        epoch_interval=epoch,
        recovery_config=rc,
    )


def free_ports(k):
    socks = [socket.socket() for _ in range(k)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--kind", choices=["tumbling", "session"], default="tumbling")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--interval-s", type=float, default=0.0)
    ap.add_argument("--proc-id", type=int, default=None)
    ap.add_argument("--addresses", default=None)
    ap.add_argument("--outdir", default=None)
    ap.add_argument("--recovery-dir", default=None)
    args = ap.parse_args()
    if args.proc_id is not None:
        worker_main(args)
        return
    work = tempfile.mkdtemp(prefix="bytewaxwin-")
    outdir = os.path.join(work, "sink")
    os.makedirs(outdir)
    rec_dir = ""
    if args.interval_s > 0:
        from bytewax.recovery import init_db_dir

        rec_dir = os.path.join(work, "recovery")
        os.makedirs(rec_dir)
        init_db_dir(Path(rec_dir), args.procs)
    t0 = time.time()
    addrs = ";".join(f"127.0.0.1:{p}" for p in free_ports(args.procs)) if args.procs > 1 else ""
    base = [
        sys.executable,
        os.path.abspath(__file__),
        "--n",
        str(args.n),
        "--kind",
        args.kind,
        "--interval-s",
        str(args.interval_s),
        "--outdir",
        outdir,
    ]
    if rec_dir:
        base += ["--recovery-dir", rec_dir]
    procs = []
    for pid in range(args.procs):
        cmd = base + ["--proc-id", str(pid)] + (["--addresses", addrs] if addrs else [])
        procs.append(subprocess.Popen(cmd))
    rcs = [p.wait() for p in procs]
    t1 = time.time()
    sinks = []
    for path in glob.glob(os.path.join(outdir, "*.json")):
        with open(path) as fh:
            sinks.append(json.load(fh))
    total = sum(s["total"] for s in sinks)
    res = {
        "system": "bytewax",
        "kind": args.kind,
        "n": args.n,
        "interval_s": args.interval_s,
        "rcs": rcs,
        "execute_s": round(t1 - t0, 3),
        "records_per_s": round(args.n / (t1 - t0)),
        "windows": sum(s["windows"] for s in sinks),
        "total": total,
        "correct": total == args.n,
    }
    print("RESULT " + json.dumps(res), flush=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
