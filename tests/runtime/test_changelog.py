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
    assert keyed.changed == {}
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


def files(*sizes: int | None) -> list[changelog_module.PendingFile]:
    """A chain whose files hold ``sizes`` keys: the first a base."""
    return [
        changelog_module.PendingFile(f"f{i}", i == 0, (0, GROUPS), keys=n)
        for i, n in enumerate(sizes)
    ]


@pytest.mark.parametrize(
    ("sizes", "merged"),
    [
        ((1000, 5, 5, 5, 5), 4),  # like deltas merge; the base is far larger: it stays
        ((10, 5, 5, 5), 4),  # the deltas hold as many keys as the base: a new base
        ((1000, 40, 5, 5), 2),  # an older merged delta far larger than the new ones stays
        ((1000, 40, 30, 30), 3),  # ... until the new ones add up to it
        ((1000, 500, 5), 2),  # no two like files: every delta
        ((10, 50), 2),  # a base and one delta
    ],
)
def test_a_compaction_merges_files_of_like_size_ending_at_the_newest(
    sizes: tuple[int, ...], merged: int
) -> None:
    chain = files(*sizes)
    run = changelog_module._run_to_merge(chain)
    assert run == tuple(chain[-merged:])


def compacting(log: KeyedChangelog) -> bool:
    chain = log._chains[OP]
    if chain.compaction is None:
        return False
    assert chain.compaction.result() is not None
    return True


def test_a_growing_state_is_not_rewritten_until_its_chain_is_long(
    storage: CheckpointStorage,
) -> None:
    # New keys at every checkpoint: the deltas share no key, so merging them would rewrite
    # the state and save a restore nothing; only max_chain deltas start a compaction.
    log, keyed = KeyedChangelog("count[0]", 0, True, min_keys=1, max_chain=6), backend()
    put(keyed, range(10), 0)
    checkpoint(log, 1, keyed, storage)
    for n in range(2, 7):
        put(keyed, range(n * 100, n * 100 + 50), n)
        checkpoint(log, n, keyed, storage)
        assert not compacting(log), n
    put(keyed, range(700, 750), 7)
    chain = checkpoint(log, 7, keyed, storage)
    assert chain is not None and len(chain) == 7
    assert compacting(log)  # six deltas: merged with the base they outgrew
    assert log._chains[OP].covers == tuple(log._chains[OP].files)
    log.close()


def test_deltas_over_the_same_keys_are_merged_before_the_chain_is_long(
    storage: CheckpointStorage,
) -> None:
    # The same 40 keys at every checkpoint: the chain soon holds more than twice the live
    # keys, and a restore would read each key again and again: the chain is merged (the
    # deltas hold more keys than the base: into a new base).
    log, keyed = KeyedChangelog("count[0]", 0, True, min_keys=1, max_chain=50), backend()
    put(keyed, range(100), 0)
    checkpoint(log, 1, keyed, storage)
    n = 1
    while not compacting(log):
        n += 1
        put(keyed, range(40), n)
        checkpoint(log, n, keyed, storage)
        assert n < 10, "no compaction"
    assert n == 4  # 100 + 3 x 40 keys written > 2 x 100 live
    assert log._chains[OP].covers == tuple(log._chains[OP].files)
    put(keyed, range(40), 99)
    shorter = checkpoint(log, n + 1, keyed, storage)
    assert shorter is not None and [r.base for r in shorter] == [True, False]
    assert restored(shorter, storage) == dict(keyed.value_state())
    log.close()
