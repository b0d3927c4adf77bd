"""Rows/s into each real-system sink at p = 2 with checkpoints every 1 s, next to the
same rows written by the plain client library in one process, in the same run; and
the checkpoint duration p50/p99 of each job.

    python benchmarks/sinks.py --rows 1000000 --repeat 3      # the figures (quiet machine)
    python benchmarks/sinks.py --rows 20000 --repeat 1        # a smoke run

Sinks: PostgresSink append (two-phase commit) vs psycopg COPY; PostgresSink upsert
(staging table, two-phase, merge on completion) vs COPY into a temporary table plus
INSERT ... ON CONFLICT; DeltaSink vs deltalake.write_deltalake; ParquetSink vs
pyarrow.parquet.write_table. "rows/s" is over the whole run (submit to end);
"after start-up" leaves out submit -> first record. Starts its own PostgreSQL (pgserver).
Each figure is the median of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runtime import Dataflow
from runtime.connectors.delta import DeltaSink
from runtime.connectors.parquet import ParquetSink
from runtime.connectors.postgres import PostgresSink
from runtime.sinks import Sink
from runtime.sources import GeneratorSource

KEYS = 10_000  # distinct keys in upsert mode
COLS = ["id", "user", "ms"]


def row(i: int) -> dict[str, Any]:
    return {"id": i, "user": f"u{i % 1000}", "ms": i % 3000}


def keyed_row(i: int) -> dict[str, Any]:
    return {"id": i % KEYS, "user": f"u{i % 1000}", "ms": i}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def through_absflow(
    name: str, rows: int, sink: Sink, make: Callable[[int], Any], launcher: str
) -> dict[str, float]:
    flow = Dataflow(f"bench-{name}", parallelism=2, checkpoint_interval=1.0)
    flow.source(GeneratorSource(make, rows), name="rows").sink(sink, name=name)
    result = flow.run(progress=False, launcher=launcher)
    durations = [c.duration_ms for c in result.checkpoints]
    startup = result.startup_seconds or 0.0
    return {
        "rate": rows / result.duration,
        "steady": rows / max(result.duration - startup, 1e-9),
        "p50": percentile(durations, 0.5),
        "p99": percentile(durations, 0.99),
    }


def plain(rows: int, make: Callable[[int], Any], write: Callable[[list[Any]], None]) -> float:
    data = [make(i) for i in range(rows)]
    start = time.perf_counter()
    write(data)
    return rows / (time.perf_counter() - start)


def start_postgres(directory: str) -> tuple[Any, str]:
    pgserver: Any = importlib.import_module("pgserver")

    server = pgserver.get_server(directory, cleanup_mode="stop")
    server.psql("ALTER SYSTEM SET max_prepared_transactions = 64;")
    server.cleanup()
    server = pgserver.get_server(directory, cleanup_mode="stop")
    return server, server.get_uri()


def main() -> None:
    import deltalake
    import psycopg
    import pyarrow as pa
    import pyarrow.parquet as pq

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--launcher", default="spark", choices=["spark", "local"])
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench-sinks-")
    server, dsn = start_postgres(os.path.join(work, "pg"))
    try:

        def sql(*statements: str) -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                for statement in statements:
                    conn.execute(statement)

        def copy_into(conn: Any, table: str, data: list[dict[str, Any]]) -> None:
            copy_sql = f'COPY {table} (id, "user", ms) FROM STDIN'
            with conn.cursor() as cur, cur.copy(copy_sql) as out:
                for r in data:
                    out.write_row((r["id"], r["user"], r["ms"]))

        def copy(table: str, data: list[dict[str, Any]]) -> None:
            with psycopg.connect(dsn) as conn:
                copy_into(conn, table, data)

        def plain_upsert(data: list[dict[str, Any]]) -> None:
            with psycopg.connect(dsn) as conn:
                conn.execute("CREATE TEMP TABLE batch (LIKE plain_upsert) ON COMMIT DROP")
                copy_into(conn, "batch", data)
                conn.execute(
                    'INSERT INTO plain_upsert SELECT DISTINCT ON (id) id, "user", ms FROM batch '
                    'ORDER BY id, ms DESC ON CONFLICT (id) DO UPDATE SET "user" = '
                    'EXCLUDED."user", ms = EXCLUDED.ms'
                )

        def fresh(n: int) -> list[tuple[str, Sink, Callable[[int], Any], str, Any]]:
            sql(
                "DROP TABLE IF EXISTS bench_append, plain_append, bench_upsert, plain_upsert",
                'CREATE TABLE bench_append (id bigint, "user" text, ms int)',
                'CREATE TABLE plain_append (id bigint, "user" text, ms int)',
                'CREATE TABLE bench_upsert (id bigint PRIMARY KEY, "user" text, ms int)',
                'CREATE TABLE plain_upsert (id bigint PRIMARY KEY, "user" text, ms int)',
            )
            run_dir = os.path.join(work, f"run-{n}")
            return [
                (
                    "pg-append",
                    PostgresSink(dsn, "bench_append", COLS),
                    row,
                    "psycopg COPY",
                    lambda d: copy("plain_append", d),
                ),
                (
                    "pg-upsert",
                    PostgresSink(dsn, "bench_upsert", COLS, "upsert", ["id"]),
                    keyed_row,
                    "COPY + ON CONFLICT",
                    plain_upsert,
                ),
                (
                    "delta",
                    DeltaSink(os.path.join(run_dir, "delta")),
                    row,
                    "write_deltalake",
                    lambda d: deltalake.write_deltalake(
                        os.path.join(run_dir, "delta-plain"), pa.Table.from_pylist(d)
                    ),
                ),
                (
                    "parquet",
                    ParquetSink(os.path.join(run_dir, "parquet")),
                    row,
                    "pyarrow.parquet",
                    lambda d: pq.write_table(
                        pa.Table.from_pylist(d), os.path.join(run_dir, "plain.parquet")
                    ),
                ),
            ]

        figures: dict[str, list[dict[str, float]]] = {}
        for n in range(args.repeat):
            for name, sink, make, plain_name, write in fresh(n):
                got = through_absflow(name, args.rows, sink, make, args.launcher)
                got["plain"] = plain(args.rows, make, write)
                figures.setdefault(f"{name}|{plain_name}", []).append(got)
        print(
            f"{args.rows:,} rows, p = 2, checkpoints every 1 s, launcher {args.launcher}, "
            f"median of {args.repeat}"
        )
        print(
            f"{'sink':<10} {'rows/s':>10} {'after start-up':>15} {'chk p50 ms':>11} "
            f"{'chk p99 ms':>11}   plain client, 1 process"
        )
        for label, runs in figures.items():
            name, plain_name = label.split("|")
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print(
                f"{name:<10} {med['rate']:>10,.0f} {med['steady']:>15,.0f} {med['p50']:>11.1f} "
                f"{med['p99']:>11.1f}   {plain_name}: {med['plain']:,.0f} rows/s"
            )
    finally:
        server.cleanup()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
