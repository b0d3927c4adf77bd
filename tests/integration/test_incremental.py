"""Incremental checkpoints of keyed state in real task processes (the harness): a task
SIGKILLed mid-chain, during a chain file's write, half way through a compaction's merged
file, and a restore at another parallelism
from an incremental checkpoint, each compared record for record with a failure-free run;
their companions drop the deltas and see the check fail."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest

from channels.partitioners import key_group_for
from jobmanager.faults import Kill
from runtime import Dataflow
from runtime.api.testing import run_local
from runtime.changelog import restore_chains
from statebackend import CheckpointStorage
from statebackend.keyed import KeyedStateBackend
from tests.integration.topologies import keyed_sums

pytestmark = [pytest.mark.harness]

KEYS = 3000
N = 50_000
INCREMENTAL: dict[str, Any] = {"incremental_min_keys": 0, "incremental_max_chain": 2}
# 10 hot keys: an epoch (50 ms at 10,000 records/s) writes each ~50 times, so after the
# first delta of the hot part the aggregate holds its epochs' values apart (EpochValues)
HOT = 10


@pytest.fixture(scope="module")
def clean() -> list[Any]:
    """The failure-free run's output (no checkpoints)."""
    return run_local(sums(N)).output("sums")


@pytest.fixture(scope="module")
def clean_hot() -> list[Any]:
    """The failure-free run's output with HOT hot keys (no checkpoints)."""
    return run_local(keyed_sums("inc-sums", N, 2, None, KEYS, HOT)).output("sums")


def sums(n: int, parallelism: int = 2, rate: float | None = None, **config: Any) -> Dataflow:
    return keyed_sums("inc-sums", n, parallelism, rate, KEYS, **config)


def finals(records: list[Any]) -> dict[Any, Any]:
    return dict(records)  # the last running sum of each key


def chained(root: Path) -> list[int]:
    """The retained checkpoints whose 'sum' state is a chain of at least two files."""
    storage = CheckpointStorage(str(root))
    return [
        n
        for n in storage.completed_checkpoints()
        if all(
            len(h.chains.get("sum", ())) >= 2
            for t, h in storage.check(n).tasks.items()
            if t.startswith("sum")
        )
    ]


@pytest.mark.parametrize(
    ("fault", "drop"),
    [
        (Kill("sum[1]", after_checkpoint=5), False),
        (Kill("sum[0]", during="snapshot", after_checkpoint=4), False),
        (Kill("sum[0]", during="compaction", after_checkpoint=10), False),
        (Kill("sum[1]", after_checkpoint=5), True),
        (Kill("sum[0]", during="compaction", after_checkpoint=10), True),
        (Kill("sum[1]", after_checkpoint=12), False),
        (Kill("sum[1]", after_checkpoint=12), True),
    ],
    ids=[
        "kill-mid-chain",
        "kill-writing-a-delta",
        "kill-during-compaction",
        "companion-drop-deltas",
        "companion-drop-deltas-compaction",
        "hot-kill-epochs-apart",
        "hot-companion-drop-deltas",
    ],
)
def test_a_kill_restores_base_and_deltas_exactly(
    request: pytest.FixtureRequest, tmp_path: Path, clean: list[Any], fault: Kill, drop: bool
) -> None:
    """Record for record against a failure-free run; the hot cases have few hot keys, so
    that reduce and aggregate hold each epoch's values apart (`EpochValues`), where the
    others write the live dict (appended new keys, then written values)."""
    hot = HOT if request.node.callspec.id.startswith("hot") else None
    if hot is not None:
        clean = request.getfixturevalue("clean_hot")
    root = tmp_path / "chk"
    config: dict[str, Any] = {
        "checkpoint_dir": str(root),
        "checkpoint_interval": 0.05,
        **INCREMENTAL,
    }
    flow = keyed_sums("inc-sums", N, 2, 10_000, KEYS, hot, debug_drop_deltas=drop, **config)
    killed = run_local(flow, faults=[fault])
    assert killed.unfired_faults == []
    [restart] = killed.restarts
    assert restart.restored_checkpoint is not None
    same = collections.Counter(killed.output("sums")) == collections.Counter(clean)
    assert same is not drop
    if not drop:
        assert chained(root), "the run restored and retained no chained checkpoint"
        steady = [c for c in killed.checkpoints if not c.final][2:]
        written = sum(c.summary.state_bytes for c in steady)
        full = sum(c.summary.full_state_bytes for c in steady)
        assert 0 < written < full  # deltas: less than the whole state each time


@pytest.mark.parametrize("drop", [False, True], ids=["exact", "companion-drop-deltas"])
def test_rescaling_from_an_incremental_checkpoint_keeps_every_key(
    tmp_path: Path, clean: list[Any], drop: bool
) -> None:
    root = tmp_path / "chk"
    config: dict[str, Any] = {"checkpoint_dir": str(root), "checkpoint_interval": 0.05}
    first = run_local(  # every checkpoint retained: one from the middle of the input is taken
        sums(
            N,
            rate=25_000,
            debug_drop_deltas=drop,
            retained_checkpoints=1000,
            **config,
            **INCREMENTAL,
        )
    )
    assert first.restarts == []
    # a chained checkpoint taken while the source still had records to read
    midway = {c.checkpoint_id for c in first.checkpoints if (c.committed_records_in or N) < N * 0.9}
    candidates = [n for n in chained(root) if n in midway]
    assert candidates, "no retained checkpoint with a chain before the end of the input"
    restore_from = str(root / f"chk-{candidates[-1]}")
    want = finals(clean)
    for parallelism in (1, 3):  # 2 -> 1 and 2 -> 3
        config = {"checkpoint_dir": str(tmp_path / f"p{parallelism}"), "checkpoint_interval": 0.05}
        resumed = run_local(
            sums(N, parallelism=parallelism, **config, **INCREMENTAL), restore_from=restore_from
        )
        got = finals(resumed.output("sums"))
        # keys the resumed run met again carry their whole sum: checkpointed plus new
        assert got
        assert all(want[k] == v for k, v in got.items()) is not drop


def test_the_final_checkpoint_is_incremental_and_restores_every_key(
    tmp_path: Path, clean: list[Any]
) -> None:
    """The final checkpoint at the end of a bounded job's input is a checkpoint like any
    other: its state is a chain (not a whole copy), and restoring that chain gives every
    key's final sum."""
    root = tmp_path / "chk"
    config = {"checkpoint_dir": str(root), "checkpoint_interval": 0.05, **INCREMENTAL}
    done = run_local(sums(N, rate=25_000, **config))
    final = max(c.checkpoint_id for c in done.checkpoints if c.final)
    assert final in chained(root)
    storage = CheckpointStorage(str(root))
    meta = storage.check(final)
    maxp = meta.max_parallelism
    keyed = KeyedStateBackend("sum", maxp, range(maxp), lambda k: key_group_for(k, maxp))
    handles = [h for task, h in meta.tasks.items() if task.startswith("sum")]
    restore_chains(keyed, "sum", handles, storage)
    assert keyed.value_state() == finals(clean)
