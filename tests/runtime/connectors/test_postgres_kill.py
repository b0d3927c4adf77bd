"""Both PostgreSQL modes under real SIGKILLs (local harness): the tables hold exactly
what a failure-free run writes. Upsert mode goes through its staging table."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest

from jobmanager.faults import Kill
from runtime import Dataflow
from runtime.api.testing import run_local
from runtime.connectors import pg_sql
from runtime.connectors.postgres import PostgresSink
from tests.conftest import Postgres
from tests.integration.topologies import HeldGenerator

# the harness fixture's checks (no task, port or temp dir left); no Spark session
pytestmark = [pytest.mark.harness, pytest.mark.slow]

N, USERS = 2_000, 13


def user_of(i: int) -> str:
    return f"u{i % USERS}"


def counts(pg: Postgres, name: str, checkpoint_dir: str, held_until: int) -> Dataflow:
    flow = Dataflow(name, parallelism=2, checkpoint_interval=0.1, checkpoint_dir=checkpoint_dir)
    # the input ends only after checkpoint `held_until`: the kill always fires
    clicks = HeldGenerator(user_of, N, checkpoint_dir, held_until, rate=1_000)
    rows = (
        flow.source(clicks, name="clicks")
        .key_by(lambda u: u)
        .aggregate(0, lambda c, _u: c + 1, name="count")
        .map(lambda kv: {"user": kv[0], "n": kv[1]}, name="row")
    )
    rows.sink(PostgresSink(pg.dsn, f"{name}_all", ["user", "n"]), name="pg")
    rows.sink(PostgresSink(pg.dsn, f"{name}_last", ["user", "n"], "upsert", ["user"]), name="pgu")
    return flow


@pytest.mark.parametrize(
    "kill",
    [
        Kill("pgu[1]", during="snapshot", after_checkpoint=2),
        Kill("pgu[0]", after_checkpoint=3),
    ],
    ids=["upsert-during-snapshot", "upsert-right-after-checkpoint"],
)
def test_both_modes_hold_a_failure_free_runs_rows_after_a_kill(
    postgres: Postgres, kill: Kill, tmp_path: Path
) -> None:
    name = "kill_" + ("snap" if kill.during else "after")
    for table, key in ((f"{name}_all", ""), (f"{name}_last", " PRIMARY KEY")):
        postgres.query(f"DROP TABLE IF EXISTS {table}")
        postgres.query(f"DROP TABLE IF EXISTS {pg_sql.staging_name(table)}")
        postgres.query(f'CREATE TABLE {table} ("user" text{key}, n int)')
    assert kill.after_checkpoint is not None
    flow = counts(postgres, name, str(tmp_path / "chk"), kill.after_checkpoint + 1)
    result = run_local(flow, faults=[kill])
    assert result.unfired_faults == []
    assert len(result.restarts) >= 1

    per_user = collections.Counter(user_of(i) for i in range(N))
    every: collections.Counter[Any] = collections.Counter(
        (u, k) for u, n in per_user.items() for k in range(1, n + 1)
    )
    assert collections.Counter(postgres.query(f'SELECT "user", n FROM {name}_all')) == every
    assert dict(postgres.query(f'SELECT "user", n FROM {name}_last')) == dict(per_user)
    assert postgres.query(f"SELECT count(*) FROM {pg_sql.staging_name(name + '_last')}") == [(0,)]
    assert postgres.prepared() == []
