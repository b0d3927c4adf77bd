"""The attempt fence in the PostgreSQL, Delta and Parquet sinks, against the real systems.

A task of a failed attempt that lives on (its host behind a partition, frozen) must not
seal or commit once the next attempt restored its sink subtask. The scenarios are
`tests/runtime/test_sink_fence.py`'s: a stale seal, a stale commit of a transaction
sealed before the takeover, a stale commit racing the takeover (between the claim and
the recovery, and between the owner check and the commit itself). The companions
switch the fence off (``owner`` reports nobody) and show the stale attempt's records
duplicated, or the new attempt's lost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from runtime.connectors.delta import DeltaSink
from runtime.connectors.parquet import ParquetSink
from runtime.connectors.postgres import PostgresSink
from runtime.sinks import SinkContext, SinkSnapshot, TwoPhaseCommitSink
from runtime.transactions import Epoch, StaleAttemptError
from tests.conftest import Postgres

SCHEMA = pa.schema([("user", pa.string()), ("n", pa.int64())])


class Kit:
    """Opens one kind of sink as attempt ``a`` of a run and reads back its output."""

    kind: type[TwoPhaseCommitSink[Any, Any]]

    def make(self) -> TwoPhaseCommitSink[Any, Any]:
        raise NotImplementedError

    def record(self, n: int) -> Any:
        return {"user": f"u{n}", "n": n}

    def output(self) -> list[int]:
        raise NotImplementedError

    def open(self, attempt: int, state: Any = None) -> TwoPhaseCommitSink[Any, Any]:
        sink = self.make()
        sink.open(SinkContext("out", 0, 1, attempt, lambda n, r: None, job="j", run="r1"))
        sink.restore_state(None if state is None else msgpack.unpackb(msgpack.packb(state)))
        return sink

    def write(self, sink: TwoPhaseCommitSink[Any, Any], *ns: int) -> None:
        sink.write_batch([self.record(n) for n in ns])

    def complete(self, sink: TwoPhaseCommitSink[Any, Any], checkpoint_id: int) -> None:
        sink.notify_checkpoint_complete(checkpoint_id)
        if sink.committer is not None:
            sink.committer.drain()

    def discard(self, sink: TwoPhaseCommitSink[Any, Any]) -> None:
        """What a dead task leaves: its committer stopped, its connections closed."""
        if sink.committer is not None:
            sink.committer.stop()


class PostgresKit(Kit):
    kind = PostgresSink

    def __init__(self, pg: Postgres, table: str) -> None:
        self.pg, self.table = pg, table

    def make(self) -> PostgresSink:
        return PostgresSink(self.pg.dsn, self.table, ["id", "name", "n"])

    def record(self, n: int) -> Any:
        return (n, "r", n)

    def output(self) -> list[int]:
        return [n for (n,) in self.pg.query(f"SELECT id FROM {self.table} ORDER BY id")]

    def discard(self, sink: Any) -> None:
        super().discard(sink)
        for conn in (sink._conn, sink._commit_conn, *sink._fence_conns):
            if conn is not None:
                conn.close()  # its open epoch rolls back


class DeltaKit(Kit):
    kind = DeltaSink

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def make(self) -> DeltaSink:
        return DeltaSink(self.uri, schema=SCHEMA)

    def output(self) -> list[int]:
        if not DeltaTable.is_deltatable(self.uri):
            return []
        return sorted(r["n"] for r in DeltaTable(self.uri).to_pyarrow_table().to_pylist())


class ParquetKit(Kit):
    kind = ParquetSink

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def make(self) -> ParquetSink:
        return ParquetSink(str(self.directory), schema=SCHEMA)

    def output(self) -> list[int]:
        parts = [p for p in self.directory.iterdir() if not p.name.startswith(".")]
        return sorted(n for p in parts for n in pq.read_table(p).column("n").to_pylist())

    def discard(self, sink: Any) -> None:
        super().discard(sink)
        txn = sink.current
        if txn is not None and txn.writer is not None:
            txn.writer.close()
            txn.stream.close()


@pytest.fixture(params=["postgres", "delta", "parquet"])
def kit(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Kit]:
    if request.param == "postgres":
        yield PostgresKit(request.getfixturevalue("postgres"), request.getfixturevalue("pg_table"))
    elif request.param == "delta":
        yield DeltaKit(str(tmp_path / "table"))
    else:
        yield ParquetKit(tmp_path / "out")


def fence_off(monkeypatch: pytest.MonkeyPatch, kit: Kit) -> None:
    monkeypatch.setattr(kit.kind, "owner", lambda self: None)


# -- a stale seal (and the commit it would lead to) ------------------------------------------
def stale_after_takeover(kit: Kit) -> tuple[Any, Any]:
    """Attempt 1 restored the subtask (from scratch) while attempt 0, cut off, lived on:
    both write records 1..3; attempt 0 reaches its barrier 3 and tries to seal and commit
    it; attempt 1 seals and commits them as checkpoint 4. What attempt 0 raised, if any."""
    stale = kit.open(attempt=0)
    new = kit.open(attempt=1)
    kit.write(stale, 1, 2, 3)
    kit.write(new, 1, 2, 3)
    raised = None
    try:
        stale.snapshot_state(3)
        kit.complete(stale, 3)
    except StaleAttemptError as err:
        raised = err
    new.snapshot_state(4)
    kit.complete(new, 4)
    kit.discard(stale)
    new.close()
    return raised, new


def test_a_stale_attempt_can_neither_seal_nor_commit(kit: Kit) -> None:
    raised, new = stale_after_takeover(kit)
    assert raised is not None and "attempt 0 will not seal checkpoint 3" in str(raised)
    assert "attempt 1 of run r1 has taken over" in str(raised)
    assert kit.output() == [1, 2, 3]
    assert new.owner() == Epoch("r1", 1)


def test_companion_without_the_fence_a_stale_attempt_duplicates_output(
    kit: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    fence_off(monkeypatch, kit)
    raised, _ = stale_after_takeover(kit)
    assert raised is None
    assert kit.output() == [1, 1, 2, 2, 3, 3]  # what the fence prevents


# -- a commit of a transaction sealed before the takeover --------------------------------------
def test_a_transaction_sealed_before_the_takeover_is_not_committed(kit: Kit) -> None:
    stale = kit.open(attempt=0)
    kit.write(stale, 1, 2, 3)
    stale.snapshot_state(3)  # sealed; then the link went down before its ack arrived
    new = kit.open(attempt=1)  # restores from scratch: 1..3 are replayed
    with pytest.raises(StaleAttemptError, match=r"will not commit checkpoint 3"):
        kit.complete(stale, 3)  # a late completion notice
    kit.write(new, 1, 2, 3)
    new.snapshot_state(4)
    kit.complete(new, 4)
    kit.discard(stale)
    new.close()
    assert kit.output() == [1, 2, 3]


# -- a commit racing the takeover (between the claim and the recovery) -------------------------
def race(kit: Kit, monkeypatch: pytest.MonkeyPatch) -> list[Exception]:
    """Attempt 0 committed record 0 with checkpoint 1, then sealed 1..3 at checkpoint 3 and
    lost its link; attempt 1 restores checkpoint 1, and attempt 0's late commit of 3 lands
    after attempt 1's claim, before its recovery. Attempt 1 replays 1..3 and adds 4 in
    checkpoint 2. What attempt 0 raised."""
    stale = kit.open(attempt=0)
    kit.write(stale, 0)
    state = stale.snapshot_state(1)
    kit.complete(stale, 1)
    kit.write(stale, 1, 2, 3)
    stale.snapshot_state(3)  # (checkpoint 2 was aborted: its transaction is still open)
    raised: list[Exception] = []
    recover = kit.kind.recover

    def racing(self: Any, snapshot: SinkSnapshot) -> None:
        try:
            kit.complete(stale, 3)
        except StaleAttemptError as err:
            raised.append(err)
        recover(self, snapshot)

    monkeypatch.setattr(kit.kind, "recover", racing)
    new = kit.open(attempt=1, state=state)
    monkeypatch.setattr(kit.kind, "recover", recover)
    kit.write(new, 1, 2, 3, 4)
    new.snapshot_state(2)
    kit.complete(new, 2)
    kit.discard(stale)
    new.close()
    return raised


def test_a_commit_racing_the_takeover_is_fenced(kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    raised = race(kit, monkeypatch)
    assert [type(e) for e in raised] == [StaleAttemptError]
    assert kit.output() == [0, 1, 2, 3, 4]


# (Not Parquet: its recovery deletes the part files of checkpoints after the restored one,
# so this racing commit is undone without the fence too.)
@pytest.mark.parametrize("kit", ["postgres", "delta"], indirect=True)
def test_companion_without_the_fence_the_racing_commit_corrupts_output(
    kit: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    fence_off(monkeypatch, kit)
    assert race(kit, monkeypatch) == []
    if isinstance(kit, DeltaKit):  # checkpoint 3 "committed": the new attempt's 2 is skipped
        assert kit.output() == [0, 1, 2, 3]
    else:
        assert kit.output() == [0, 1, 1, 2, 2, 3, 3, 4]


# -- a claim landing between the owner check and the commit ------------------------------------
def between_check_and_commit(
    kit: Kit, monkeypatch: pytest.MonkeyPatch, during: Callable[[], None]
) -> Exception | None:
    """Attempt 0 commits checkpoint 3 (sealed before the takeover); ``during`` runs once
    the commit passed its owner check, before it reaches the system. What it raised."""
    stale = kit.open(attempt=0)
    kit.write(stale, 1, 2, 3)
    stale.snapshot_state(3)
    commit = kit.kind.commit

    def late(self: Any, checkpoint_id: int, handle: Any) -> None:
        if self is stale:
            during()
        commit(self, checkpoint_id, handle)

    monkeypatch.setattr(kit.kind, "commit", late)
    try:
        kit.complete(stale, 3)
    except StaleAttemptError as err:
        return err
    finally:
        kit.discard(stale)
    return None


def test_postgres_a_claim_waits_for_a_commit_in_flight(
    postgres: Postgres, pg_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit holds the owner row (share): the claim of attempt 1 waits until the commit
    is done, then its restore finds checkpoint 3 committed (a legitimate commit: it
    completed before the takeover, so attempt 1 restores checkpoint 3 and replays nothing)."""
    kit = PostgresKit(postgres, pg_table)
    opened: list[Any] = []
    claimed = threading.Event()

    def takeover() -> None:
        opened.append(kit.open(attempt=1, state={"checkpoint": 3, "pending": []}))
        claimed.set()

    thread = threading.Thread(target=takeover)

    def during() -> None:
        thread.start()
        assert not claimed.wait(1.0), "the claim did not wait for the commit in flight"

    assert between_check_and_commit(kit, monkeypatch, during) is None
    thread.join(30)
    assert claimed.is_set() and kit.output() == [1, 2, 3]
    opened[0].close()


def test_delta_a_claim_between_check_and_commit_makes_the_commit_conflict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Delta has no lock: the claim commits between attempt 0's owner check and its data
    commit, and the data commit (based on the version it checked) conflicts."""
    kit = DeltaKit(str(tmp_path / "table"))
    opened: list[Any] = []
    raised = between_check_and_commit(kit, monkeypatch, lambda: opened.append(kit.open(attempt=1)))
    assert raised is not None and "claimed" in str(raised) and "attempt 1 of run r1" in str(raised)
    assert kit.output() == []
    opened[0].close()


def test_companion_delta_without_the_conflict_the_stale_commit_lands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kit = DeltaKit(str(tmp_path / "table"))
    monkeypatch.setattr(DeltaSink, "fence_id", property(lambda self: f"{self.app_id}:x{id(self)}"))
    opened: list[Any] = []  # each attempt claims its own id: nothing to conflict with
    raised = between_check_and_commit(kit, monkeypatch, lambda: opened.append(kit.open(attempt=1)))
    assert raised is None and kit.output() == [1, 2, 3]  # after attempt 1's restore
    opened[0].close()
