"""A task's part of each checkpoint (``runtime.checkpointer.TaskCheckpointer``) without
processes or sockets: a chain that captures a given operator state, a real
``CheckpointStorage`` in a temp dir, and the messages it sends the job manager kept in a
list. The whole path, barriers and kills included, runs in the pipeline tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from channels.messages import Barrier, Event
from runtime import control as P
from runtime.chain import Capture
from runtime.checkpointer import TaskCheckpointer, TaskIdentity
from runtime.control import CheckpointFailureReason
from runtime.errors import CheckpointStorageError
from runtime.task_faults import TaskFaults
from statebackend.keyed import KeyedStateBackend
from statebackend.metadata import OperatorLayout
from statebackend.metrics import AckMetrics
from statebackend.rocksdb import RocksDBStateBackend
from statebackend.snapshot import OperatorSnapshot, read_operator_state
from statebackend.storage import CheckpointStorage

TASK = TaskIdentity(0, 0, "op[0]", "host-a")


class Chain:
    """The task's operators, as the checkpointer sees them: one with ``state``."""

    def __init__(self, state: bytes) -> None:
        self.state = state
        self.finished = False
        self.completed: list[int] = []

    def capture(
        self, checkpoint_id: int, storage: CheckpointStorage | None, savepoint: bool = False
    ) -> Capture:
        snapshot = OperatorSnapshot(self.state + str(checkpoint_id).encode(), None, None)
        return Capture({"op": snapshot}, {"op": OperatorLayout(0, 1)}, keys=0)

    def finish(self) -> None:
        self.finished = True

    def notify_complete(self, checkpoint_id: int) -> None:
        self.completed.append(checkpoint_id)


class Channel:
    """An output channel that keeps the events sent on it."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def send_event(self, event: Event) -> None:
        self.events.append(event)

    def send_priority(self, event: Event) -> None:
        self.events.append(event)


class Setup:
    def __init__(self, root: Path, state: bytes = b"x" * 200, **options: Any) -> None:
        self.storage = CheckpointStorage(str(root), inline_threshold=options.pop("inline", 0))
        self.chain, self.channel = Chain(state), Channel()
        self.sent: list[P.Message] = []
        self.checkpointer = TaskCheckpointer(
            TASK,
            self.chain,
            [self.channel],  # type: ignore[list-item]  # an Output as far as it is used
            self.storage,
            self.sent.append,
            None,
            TaskFaults([], 0, 0),
            **options,
        )

    def checkpoint(self, n: int, final: bool = False, savepoint: bool = False) -> None:
        self.checkpointer.checkpoint(Barrier(n, 0.0, final, savepoint), AckMetrics())


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    s = Setup(tmp_path / "chk")
    s.checkpointer.start()
    yield s
    s.checkpointer.close()


def test_the_barrier_goes_out_and_the_written_state_is_acked(setup: Setup) -> None:
    setup.checkpoint(1)
    assert setup.channel.events == [Barrier(1, 0.0)]
    setup.checkpointer.collect_writes(wait=True)
    (ack,) = setup.sent
    assert isinstance(ack, P.Ack) and ack.checkpoint_id == 1 and ack.state is not None
    path = setup.storage.task_state_path(1, TASK.task_id)
    assert read_operator_state(path, "op") == b"x" * 200 + b"1"
    assert ack.state.size == Path(path).stat().st_size == ack.metrics.state_bytes


def test_acks_go_in_checkpoint_order(setup: Setup) -> None:
    for n in (1, 2, 3):
        setup.checkpoint(n)
    setup.checkpointer.collect_writes(wait=True)
    assert [m.checkpoint_id for m in setup.sent if isinstance(m, P.Ack)] == [1, 2, 3]
    assert not setup.checkpointer.writes_pending


def test_a_small_state_is_acked_inline_at_once(tmp_path: Path) -> None:
    s = Setup(tmp_path / "chk", b"tiny", inline=1000)
    try:
        s.checkpoint(1)  # no collect_writes: acked on the task's thread
        (ack,) = s.sent
        assert isinstance(ack, P.Ack) and ack.state is not None and ack.state.inline
        assert not Path(s.storage.task_state_path(1, TASK.task_id)).exists()
    finally:
        s.checkpointer.close()


def test_a_failed_write_is_declined_and_the_next_one_acked(setup: Setup) -> None:
    setup.checkpoint(1)
    setup.checkpointer.collect_writes(wait=True)
    # checkpoint 2's directory cannot be made: a file is in its way
    Path(setup.storage.location(2)).write_bytes(b"")
    setup.checkpoint(2)
    setup.checkpointer.collect_writes(wait=True)
    decline = setup.sent[-1]
    assert isinstance(decline, P.Decline) and decline.checkpoint_id == 2
    assert decline.reason is CheckpointFailureReason.STATE_WRITE_FAILED and decline.detail
    setup.checkpoint(3)
    setup.checkpointer.collect_writes(wait=True)
    assert isinstance(setup.sent[-1], P.Ack) and setup.sent[-1].checkpoint_id == 3


def test_storage_no_write_reaches_raises_naming_it_and_the_host(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    s = Setup(tmp_path / "file" / "chk")  # under a file: neither the state nor a probe
    try:
        s.checkpoint(1)
        with pytest.raises(CheckpointStorageError) as err:
            s.checkpointer.collect_writes(wait=True)
        assert "host-a" in str(err.value) and str(tmp_path / "file") in str(err.value)
        assert s.sent == []
    finally:
        s.checkpointer.close()


def test_an_aborted_checkpoint_is_neither_acked_nor_declined(setup: Setup) -> None:
    setup.checkpoint(1)
    setup.checkpoint(2)
    setup.checkpointer.aborted(1)  # the job manager removes its files
    setup.checkpointer.collect_writes(wait=True)
    assert [(type(m), getattr(m, "checkpoint_id", None)) for m in setup.sent] == [(P.Ack, 2)]


def test_the_final_barrier_finishes_the_chain_and_its_completion_ends_the_task(
    setup: Setup,
) -> None:
    setup.checkpoint(4, final=True)
    assert setup.chain.finished and setup.checkpointer.final_checkpoint == 4
    setup.checkpointer.collect_writes(wait=True)
    setup.checkpointer.complete(3)
    assert not setup.checkpointer.completed_final
    setup.checkpointer.complete(4)
    assert setup.chain.completed == [3, 4] and setup.checkpointer.completed_final


def group(key: Any) -> int:
    return int(key) % 8


class StoreChain(Chain):
    """A chain whose one operator keeps keyed state in RocksDB."""

    def __init__(self, directory: Path) -> None:
        super().__init__(b"")
        directory.mkdir()
        self.keyed = RocksDBStateBackend("op", 8, range(8), group, lambda: str(directory))
        values = self.keyed.value_state()
        for i in range(1000):
            values[i] = -i

    def capture(
        self, checkpoint_id: int, storage: CheckpointStorage | None, savepoint: bool = False
    ) -> Capture:
        store = self.keyed.local_checkpoint(checkpoint_id, canonical=savepoint)
        snapshot = OperatorSnapshot(None, None, self.keyed.key_groups)
        return Capture({"op": snapshot}, {"op": OperatorLayout(0, 1, (0, 8))}, 0, None, (store,))


def test_a_savepoint_of_rocksdb_state_is_canonical_and_leaves_no_local_file(
    tmp_path: Path,
) -> None:
    """A checkpoint uploads RocksDB's files; a savepoint writes the canonical snapshot,
    spooled on the writer thread, into the state file and removes the spool and the
    local checkpoint."""
    s = Setup(tmp_path / "chk")
    s.chain = chain = StoreChain(tmp_path / "task")
    s.checkpointer.chain = chain
    try:
        s.checkpoint(1)
        s.checkpoint(2, final=True, savepoint=True)
        s.checkpointer.collect_writes(wait=True)
        first, final = s.sent
        assert isinstance(first, P.Ack) and first.state is not None and first.state.stores
        assert isinstance(final, P.Ack) and final.state is not None and not final.state.stores
        (blob,) = s.storage.read_keyed_state(2, final.state, "op", range(8))
        restored = KeyedStateBackend("op", 8, range(8), group)
        restored.restore([blob])
        assert restored.value_state() == {i: -i for i in range(1000)}
        assert [p.name for p in (tmp_path / "task").iterdir()] == [
            Path(str(chain.keyed._path)).name
        ]
    finally:
        s.checkpointer.close()
        chain.keyed.close()
