"""A task's incremental checkpoints of keyed state (runtime/changelog.py), without a task:
a base once the state is big enough, then deltas; the chain written and restored equals the
live state; a failed file poisons its chain until a new base; compaction shortens a chain
without changing what it restores."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import msgpack
import pytest

from runtime import changelog as changelog_module
from runtime.changelog import KeyedChangelog, restore_chains
from statebackend.errors import StateError
from statebackend.incremental import StateRef
from statebackend.keyed import KeyedStateBackend
from statebackend.metadata import OperatorLayout, TaskStateHandle
from statebackend.storage import CheckpointStorage

GROUPS = 8
OP = "count"


def group_of(key: Any) -> int:
    return zlib.crc32(msgpack.packb(key)) % GROUPS


def backend() -> KeyedStateBackend:
    keyed = KeyedStateBackend(OP, GROUPS, range(GROUPS), group_of)
    keyed.track_changes()
    return keyed


def put(keyed: KeyedStateBackend, keys: range, value: int) -> None:
    assert keyed.changed is not None
    for key in keys:
        keyed.value_state()[key] = value
        keyed.changed.add(key)


def checkpoint(
    log: KeyedChangelog, n: int, keyed: KeyedStateBackend, storage: CheckpointStorage
) -> tuple[StateRef, ...] | None:
    """Checkpoint ``n``: capture, then write as the writer thread does; the chain, or None
    when the operator was snapshotted whole."""
    if not log.capture(n, OP, keyed, storage):
        assert log.take() is None
        return None
    staged = log.take()
    assert staged is not None and staged.checkpoint_id == n
    chains, written = staged.write(storage)
    assert written > 0
    return chains[OP]


def restored(chain: tuple[StateRef, ...], storage: CheckpointStorage) -> dict[Any, Any]:
    handle = TaskStateHandle("", 0, 0, {OP: OperatorLayout(0, 1, (0, GROUPS))}, None, {OP: chain})
    fresh = backend()
    inherited = restore_chains(fresh, OP, [handle], storage)
    assert inherited is not None and len(inherited) == len(chain)
    return dict(fresh.value_state())


@pytest.fixture
def storage(tmp_path: Path) -> CheckpointStorage:
    return CheckpointStorage(str(tmp_path / "chk"))


def test_a_small_state_is_checkpointed_whole_and_forgets_its_changes(
    storage: CheckpointStorage,
) -> None:
    log, keyed = KeyedChangelog("count[0]", 0, True, min_keys=10, max_chain=5), backend()
    put(keyed, range(9), 1)
    assert checkpoint(log, 1, keyed, storage) is None
    assert keyed.changed == set()
    disabled = KeyedChangelog("count[0]", 0, False, min_keys=0, max_chain=5)
    put(keyed, range(100), 1)
    assert checkpoint(disabled, 2, keyed, storage) is None


def test_a_base_then_deltas_restore_the_live_state(storage: CheckpointStorage) -> None:
    log, keyed = KeyedChangelog("count[0]", 0, True, min_keys=10, max_chain=50), backend()
    put(keyed, range(100), 0)
    chain = checkpoint(log, 1, keyed, storage)
    assert chain is not None and [r.base for r in chain] == [True]
    for n in range(2, 6):
        put(keyed, range(n * 10, n * 10 + 5), n)
        chain = checkpoint(log, n, keyed, storage)
        assert chain is not None and [r.base for r in chain] == [True] + [False] * (n - 1)
        assert chain[-1].size < chain[0].size  # a delta holds the changed keys only
        assert restored(chain, storage) == dict(keyed.value_state())
    log.close()


def failing_write(monkeypatch: pytest.MonkeyPatch) -> None:
    def full_disk(*args: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(changelog_module, "write_chain_file", full_disk)


def test_a_checkpoint_whose_chain_holds_a_failed_file_declines(
    storage: CheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, keyed = KeyedChangelog("count[0]", 0, True, min_keys=1, max_chain=50), backend()
    put(keyed, range(20), 0)
    checkpoint(log, 1, keyed, storage)
    staged = []
    for n in (2, 3):  # 3 is captured while the writer thread is still behind, on 2
        put(keyed, range(n), n)
        assert log.capture(n, OP, keyed, storage)
        staged.append(log.take())
    second, third = staged
    assert second is not None and third is not None
    with monkeypatch.context() as m:
        failing_write(m)
        with pytest.raises(OSError, match="No space left"):
            second.write(storage)
    with pytest.raises(
        StateError, match=r"the chain of 'count' holds .*2-0-chk.*whose write failed"
    ):
        third.write(storage)


def test_the_next_checkpoint_after_a_failed_file_starts_a_new_base(
    storage: CheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, keyed = KeyedChangelog("count[0]", 0, True, min_keys=1, max_chain=50), backend()
    put(keyed, range(20), 0)
    checkpoint(log, 1, keyed, storage)
    put(keyed, range(3), 2)
    with monkeypatch.context() as m:
        failing_write(m)
        with pytest.raises(OSError, match="No space left"):
            checkpoint(log, 2, keyed, storage)
    put(keyed, range(3, 5), 3)
    chain = checkpoint(log, 3, keyed, storage)
    assert chain is not None and [r.base for r in chain] == [True]
    assert restored(chain, storage) == dict(keyed.value_state())


def test_compaction_shortens_the_chain_and_restores_the_same(storage: CheckpointStorage) -> None:
    log, keyed = KeyedChangelog("count[0]", 0, True, min_keys=1, max_chain=3), backend()
    put(keyed, range(200), 0)
    chain = checkpoint(log, 1, keyed, storage)
    n = 1
    while log._chains[OP].compaction is None:  # a chain of max_chain deltas: compaction starts
        n += 1
        put(keyed, range(n, n + 2), n)
        chain = checkpoint(log, n, keyed, storage)
    assert chain is not None and len(chain) == 4
    future = log._chains[OP].compaction
    assert future is not None and future.result() is not None  # wait for the thread
    put(keyed, range(300, 302), 99)
    shorter = checkpoint(log, n + 1, keyed, storage)  # the merged file replaces its inputs
    assert log.compactions == 1
    # The deltas were small against the base: merged alone, the base stays.
    assert shorter is not None and [r.base for r in shorter] == [True, False, False]
    assert shorter[0] == chain[0]
    assert restored(shorter, storage) == dict(keyed.value_state())
    log.close()
