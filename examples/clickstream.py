"""Clickstream: JSON-lines files land in a directory while the job runs; the job cleans
them, keeps per-user totals in keyed state, and writes them exactly once to a Delta
table (every update) and to PostgreSQL (the latest total per user, upserted).

    python examples/clickstream.py                      # starts its own PostgreSQL
    python examples/clickstream.py --dsn postgresql://user:pw@host/db
    python examples/clickstream.py --kill-task totals[1] --after chk3
    python examples/clickstream.py --chaos 3            # 3 random kills
    python examples/clickstream.py --rescale-to 3       # stop with a savepoint, resume at p=3

A generator thread writes --files files of --events events in all (some malformed
lines, some events without a user) into <--out>/incoming, one every --every seconds
(the first before the job starts, the others once it committed its first checkpoint),
then a _SUCCESS marker: the source ends once it has read everything before it. With
``--rescale-to P`` the job is stopped with a savepoint (as ``python -m jobmanager stop``
does) once it committed a checkpoint and a third of the files are in, then resumed from
that savepoint at parallelism P while files keep landing; the check covers both runs.
Needs ``pip install absflow[connectors] pgserver``. The result is checked against the
totals computed from the generated files.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples import scaffold
from jobmanager.stop import request_stop, running_jobs
from runtime import Dataflow
from runtime.connectors.delta import DeltaSink
from runtime.connectors.files import FileStreamSource, is_dead_letter
from runtime.connectors.postgres import PostgresSink

PAGES = ["/", "/search", "/cart", "/checkout", "/help"]


def events(n: int, seed: int = 7) -> list[str]:
    """Deterministic JSON lines; every 97th is malformed, every 31st has no user."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        if i % 97 == 96:
            lines.append('{"user": "broken')
            continue
        event = {"user": f"u{rng.randint(0, 49)}", "page": rng.choice(PAGES).upper()}
        event["ms"] = rng.randint(5, 3_000)
        if i % 31 == 30:
            del event["user"]
        lines.append(json.dumps(event))
    return lines


def generate(directory: str, lines: list[str], files: int, every_s: float, delta: str) -> None:
    """Write the first file, wait until the job committed something (the Delta table
    exists: the job is running), then the others, one every ``every_s``."""
    per = -(-len(lines) // files)
    for f in range(files):
        if f == 1:
            while not os.path.exists(os.path.join(delta, "_delta_log")):
                time.sleep(0.05)
        tmp = os.path.join(directory, f".clicks-{f:04d}.jsonl")
        with open(tmp, "w") as fh:
            fh.write("\n".join(lines[f * per : (f + 1) * per]) + "\n")
        os.replace(tmp, os.path.join(directory, f"clicks-{f:04d}.jsonl"))
        time.sleep(every_s)
    open(os.path.join(directory, "_SUCCESS"), "w").close()


def clean(event: Any) -> list[dict[str, Any]]:
    if not isinstance(event, dict) or "user" not in event or is_dead_letter(event):
        return []
    return [{"user": event["user"], "page": str(event["page"]).lower(), "ms": int(event["ms"])}]


def add(total: Any, event: dict[str, Any]) -> Any:
    clicks, ms = total
    return (clicks + 1, ms + event["ms"])


def build(
    args: argparse.Namespace, dsn: str, delta: str, parallelism: int, **config: Any
) -> Dataflow:
    flow = Dataflow(f"clickstream-{args.run_id}", parallelism=parallelism, **config)
    totals = (
        flow.source(
            FileStreamSource(
                os.path.join(args.out, "incoming"),
                poll_interval_s=0.2,
                on_error="dead_letter",
                done_marker="_SUCCESS",
            ),
            name="clicks",
        )
        .flat_map(clean, name="clean")
        .key_by(lambda e: e["user"])
        .aggregate((0, 0), add, name="totals")
        .map(lambda kv: {"user": kv[0], "clicks": kv[1][0], "total_ms": kv[1][1]}, name="row")
    )
    totals.sink(DeltaSink(delta), name="delta")
    totals.sink(
        PostgresSink(dsn, "user_totals", ["user", "clicks", "total_ms"], "upsert", ["user"]),
        name="postgres",
    )
    return flow


def stop_mid_run(job: str, incoming: str, delta: str, files: int) -> None:
    """Ask ``job`` to stop with a savepoint once it committed to Delta and a third of the
    files are in (what ``python -m jobmanager stop JOB`` does)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        landed = [f for f in os.listdir(incoming) if f.startswith("clicks-")]
        running = [j for j in running_jobs() if j.job == job]
        if (
            running
            and len(landed) >= max(2, files // 3)
            and os.path.isdir(os.path.join(delta, "_delta_log"))
        ):
            request_stop(running[0])
            return
        time.sleep(0.05)


def start_postgres(directory: str) -> tuple[Any, str]:
    import pgserver

    server = pgserver.get_server(directory, cleanup_mode="stop")
    server.psql("ALTER SYSTEM SET max_prepared_transactions = 64;")
    server.cleanup()
    server = pgserver.get_server(directory, cleanup_mode="stop")
    return server, server.get_uri()


def main(argv: list[str] | None = None) -> int:
    ap = scaffold.parser(__doc__)
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--every", type=float, default=0.1, help="seconds between two files")
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument(
        "--rescale-to",
        type=int,
        default=None,
        metavar="P",
        help="stop with a savepoint mid-run, then resume from it at parallelism P",
    )
    ap.add_argument("--dsn", default=None, help="PostgreSQL DSN (default: start one)")
    ap.add_argument("--out", default=None, help="directory for input and the Delta table")
    scaffold.add_checkpoint_arguments(ap)
    return scaffold.run_example(ap, run, argv)


def run(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    owned_out = args.out is None
    args.out = os.path.abspath(args.out or tempfile.mkdtemp(prefix="clickstream-"))
    args.run_id = time.strftime("%Y%m%d-%H%M%S")
    incoming, delta = os.path.join(args.out, "incoming"), os.path.join(args.out, "totals.delta")
    os.makedirs(incoming, exist_ok=True)
    server = None
    try:
        dsn = args.dsn
        if dsn is None:
            server, dsn = start_postgres(os.path.join(args.out, "pg"))
            print(f"started PostgreSQL in {args.out}/pg")
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS user_totals "
                '("user" text PRIMARY KEY, clicks int, total_ms bigint)'
            )
            conn.execute("TRUNCATE user_totals")
        lines = events(args.events)
        config = scaffold.checkpoint_config(args)
        if args.rescale_to:
            if not config:
                ap.error("--rescale-to needs checkpoints (--checkpoint-interval > 0)")
            config["checkpoint_dir"] = config["checkpoint_dir"] or os.path.join(args.out, "chk")
        flow = build(args, dsn, delta, args.parallelism, **config)
        faults = scaffold.faults_from(ap, args, flow.plan())
        writer = threading.Thread(
            target=generate, args=(incoming, lines, args.files, args.every, delta), daemon=True
        )
        writer.start()
        if args.rescale_to:
            threading.Thread(
                target=stop_mid_run, args=(flow.name, incoming, delta, args.files), daemon=True
            ).start()
        result = flow.run(faults=faults)
        restarts = len(result.restarts)
        print(result.summary())
        if args.rescale_to and result.stopped:
            print(
                f"stopped with savepoint {result.savepoint}; resuming at parallelism "
                f"{args.rescale_to} while files keep landing"
            )
            flow = build(args, dsn, delta, args.rescale_to, **config)
            result = flow.run(restore_from=result.savepoint)
            restarts += len(result.restarts)
            print(result.summary())
        elif args.rescale_to:
            print("the job ended before the stop was asked: no savepoint, nothing to resume")
        writer.join()
        return check(lines, dsn, delta, restarts)
    finally:
        if server is not None:
            server.cleanup()
        if owned_out:
            shutil.rmtree(args.out, ignore_errors=True)


def check(lines: list[str], dsn: str, delta: str, restarts: int) -> int:
    import psycopg
    from deltalake import DeltaTable

    totals: dict[str, tuple[int, int]] = {}
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        for e in clean(event):
            totals[e["user"]] = add(totals.get(e["user"], (0, 0)), e)
    with psycopg.connect(dsn) as conn:
        in_pg = {
            u: (c, ms)
            for u, c, ms in conn.execute('SELECT "user", clicks, total_ms FROM user_totals')
        }
    # Files are read in parallel, so a user's running totals may step through other
    # intermediate values than a sequential read; exactly once means each user has the
    # updates 1..n once each, and the last equals the total.
    updates: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for r in DeltaTable(delta).to_pyarrow_table().to_pylist():
        updates[r["user"]].append((r["clicks"], r["total_ms"]))
    ok_delta = set(updates) == set(totals) and all(
        sorted(c for c, _ in rows) == list(range(1, totals[u][0] + 1)) and max(rows) == totals[u]
        for u, rows in updates.items()
    )
    ok_pg = in_pg == totals
    n_updates = sum(len(rows) for rows in updates.values())
    print(f"{len(totals)} users, {n_updates} updates in Delta, {restarts} restart(s)")
    print(f"PostgreSQL user_totals equal the expected totals: {'YES' if ok_pg else 'NO'}")
    print(f"Delta table holds every update exactly once: {'YES' if ok_delta else 'NO'}")
    return 0 if ok_pg and ok_delta else 1


if __name__ == "__main__":
    sys.exit(main())
