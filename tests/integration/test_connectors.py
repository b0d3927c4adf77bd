"""The real-system sinks under real SIGKILLs on local Spark: PostgreSQL (2PC), Delta and
Parquet part files hold exactly what a failure-free run writes, record for record
(the Parquet files as Spark reads them)."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest

from jobmanager.faults import Kill
from runtime import Dataflow
from runtime.sources import GeneratorSource
from tests.conftest import Postgres

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("no_leaks")]

N, USERS = 3_000, 13


def user_of(i: int) -> str:
    return f"u{i % USERS}"


def expected() -> collections.Counter[tuple[str, int]]:
    """A running count per user, each step once."""
    counts = collections.Counter(user_of(i) for i in range(N))
    return collections.Counter((u, k) for u, n in counts.items() for k in range(1, n + 1))


def clicks(name: str, pg: Postgres, table: str, delta: str, parquet: str) -> Dataflow:
    from runtime.connectors.delta import DeltaSink
    from runtime.connectors.parquet import ParquetSink
    from runtime.connectors.postgres import PostgresSink

    flow = Dataflow(name, parallelism=2, checkpoint_interval=0.1)
    rows = (
        flow.source(GeneratorSource(user_of, N, rate=500), name="clicks")  # ~6 s
        .key_by(lambda u: u)
        .aggregate(0, lambda c, _u: c + 1, name="count")
        .map(lambda kv: {"user": kv[0], "n": kv[1]}, name="row")
    )
    rows.sink(PostgresSink(pg.dsn, table, ["user", "n"]), name="pg")
    rows.sink(DeltaSink(delta), name="delta")
    rows.sink(ParquetSink(parquet), name="files")
    return flow


@pytest.mark.parametrize(
    "kill",
    # After the first checkpoint: on a loaded machine the sinks' first claims and seals
    # (a round trip each to PostgreSQL and the Delta log) may leave a short job few more.
    [Kill("pg[1]", during="snapshot", after_checkpoint=1), Kill("delta[0]", after_checkpoint=1)],
    ids=["pg-during-snapshot", "delta-right-after-checkpoint"],
)
def test_sinks_hold_a_failure_free_runs_rows_after_a_kill(
    spark: Any, postgres: Postgres, tmp_path: Path, kill: Kill
) -> None:
    from deltalake import DeltaTable

    table = f"clicks_{kill.task[:-3]}"
    postgres.query(f"DROP TABLE IF EXISTS {table}")
    postgres.query(f'CREATE TABLE {table} ("user" text, n int)')
    delta, parquet = str(tmp_path / "delta"), str(tmp_path / "parquet")
    result = clicks(f"clicks-{kill.task[:-3]}", postgres, table, delta, parquet).run(faults=[kill])
    assert len(result.restarts) >= 1

    want = expected()
    in_pg = collections.Counter(postgres.query(f'SELECT "user", n FROM {table}'))
    assert in_pg == want
    in_delta = collections.Counter(
        (r["user"], r["n"]) for r in DeltaTable(delta).to_pyarrow_table().to_pylist()
    )
    assert in_delta == want
    in_parquet = collections.Counter(
        (r["user"], r["n"]) for r in spark.read.parquet(parquet).collect()
    )
    assert in_parquet == want
    assert postgres.prepared() == []
