"""Rows/s into each real-system sink at p = 2 with checkpoints every 1 s, next to the
same rows written by the plain client library in one process, in the same run; and
the checkpoint duration p50/p99 of each job.

    python benchmarks/sinks.py [rows]       # default 200,000 rows; starts PostgreSQL

Sinks: PostgresSink (append, two-phase commit) vs psycopg COPY; DeltaSink vs
deltalake.write_deltalake; ParquetSink vs pyarrow.parquet.write_table. Needs
``pip install absflow[connectors] pgserver``.
"""

from __future__ import annotations

import os
import shutil
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


def row(i: int) -> dict[str, Any]:
    return {"id": i, "user": f"u{i % 1000}", "ms": i % 3000}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def through_absflow(name: str, rows: int, sink: Sink) -> tuple[float, float, float]:
    flow = Dataflow(f"bench-{name}", parallelism=2, checkpoint_interval=1.0)
    flow.source(GeneratorSource(row, rows), name="rows").sink(sink, name=name)
    result = flow.run(progress=False)
    durations = [float(c["duration_ms"]) for c in result.checkpoints]
    return rows / result.duration, percentile(durations, 0.5), percentile(durations, 0.99)


def plain(rows: int, write: Callable[[list[dict[str, Any]]], None]) -> float:
    data = [row(i) for i in range(rows)]
    start = time.perf_counter()
    write(data)
    return rows / (time.perf_counter() - start)


def main() -> None:
    import deltalake
    import pgserver
    import psycopg
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    work = tempfile.mkdtemp(prefix="bench-sinks-")
    server = pgserver.get_server(os.path.join(work, "pg"), cleanup_mode="stop")
    try:
        server.psql("ALTER SYSTEM SET max_prepared_transactions = 64;")
        server.cleanup()
        server = pgserver.get_server(os.path.join(work, "pg"), cleanup_mode="stop")
        dsn = server.get_uri()
        with psycopg.connect(dsn, autocommit=True) as conn:
            for t in ("bench_sink", "bench_plain"):
                conn.execute(f'CREATE TABLE {t} (id bigint, "user" text, ms int)')

        def copy(data: list[dict[str, Any]]) -> None:
            copy_sql = 'COPY bench_plain (id, "user", ms) FROM STDIN'
            with psycopg.connect(dsn) as conn, conn.cursor() as cur, cur.copy(copy_sql) as out:
                for r in data:
                    out.write_row((r["id"], r["user"], r["ms"]))

        cols = ["id", "user", "ms"]
        cases = [
            (
                "postgres",
                PostgresSink(dsn, "bench_sink", cols),
                "psycopg COPY",
                copy,
            ),
            (
                "delta",
                DeltaSink(os.path.join(work, "delta")),
                "deltalake.write_deltalake",
                lambda d: deltalake.write_deltalake(
                    os.path.join(work, "delta-plain"), pa.Table.from_pylist(d)
                ),
            ),
            (
                "parquet",
                ParquetSink(os.path.join(work, "parquet")),
                "pyarrow.parquet",
                lambda d: pq.write_table(
                    pa.Table.from_pylist(d), os.path.join(work, "plain.parquet")
                ),
            ),
        ]
        print(f"{rows:,} rows, p = 2, checkpoints every 1 s")
        print(f"{'sink':<10} {'absflow rows/s':>15} {'chk p50 ms':>11} {'chk p99 ms':>11}   plain")
        for name, sink, plain_name, write in cases:
            rate, p50, p99 = through_absflow(name, rows, sink)
            base = plain(rows, write)
            print(
                f"{name:<10} {rate:>15,.0f} {p50:>11.1f} {p99:>11.1f}   "
                f"{plain_name}: {base:,.0f} rows/s (1 process)"
            )
    finally:
        server.cleanup()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
