"""Keyed state on the rocksdb backend in real task processes (the harness): a task
SIGKILLed after checkpoints and while its checkpoint is being uploaded, restores at
another parallelism (2 -> 3, 2 -> 1) from a RocksDB checkpoint, and savepoints taken on
one backend resumed on the other; each compared record for record with a failure-free
run, each with a companion showing the check fails when the mechanism is off."""

from __future__ import annotations

import collections
import os
from pathlib import Path
from typing import Any

import pytest

from jobmanager.faults import Kill
from runtime import Dataflow
from runtime.sources import GeneratorSource
from runtime.testing import run_local
from statebackend import CheckpointStorage

pytest.importorskip("rocksdict")
pytestmark = [pytest.mark.harness]

KEYS = 3000
N = 40_000
ROCKSDB: dict[str, Any] = {"state_backend": "rocksdb", "state_memory_budget_mb": 8}


@pytest.fixture(scope="module")
def clean() -> list[Any]:
    """The failure-free run's output (in memory, no checkpoints)."""
    return run_local(sums(N)).output("sums")


def sums(n: int, parallelism: int = 2, rate: float | None = None, **config: Any) -> Dataflow:
    """A running sum per key; a tenth of the keys are hot after the first pass."""

    def record(i: int) -> tuple[int, int]:
        key = i % KEYS if i < KEYS else (i * 7) % (KEYS // 10)
        return key, i % 7

    flow = Dataflow("rocks-sums", parallelism=parallelism, ui=False, **config)
    (
        flow.source(GeneratorSource(record, n, rate=rate), name="numbers")
        .key_by(lambda r: r[0])
        .aggregate(0, lambda acc, r: acc + r[1], name="sum")
        .collect("sums")
    )
    return flow


def stored(root: Path) -> list[int]:
    """Completed checkpoints whose 'sum' state is RocksDB files in every task."""
    storage = CheckpointStorage(str(root))
    return [
        n
        for n in storage.completed_checkpoints()
        if all("sum" in h.stores for t, h in storage.check(n).tasks.items() if t.startswith("sum"))
    ]


def test_a_failure_free_run_on_rocksdb_is_exact(tmp_path: Path, clean: list[Any]) -> None:
    root = tmp_path / "chk"
    result = run_local(
        sums(N, rate=10_000, checkpoint_dir=str(root), checkpoint_interval=0.05, **ROCKSDB),
    )
    assert collections.Counter(result.output("sums")) == collections.Counter(clean)
    assert stored(root), "no checkpoint holds the state as RocksDB files"
    steady = [c for c in result.checkpoints if not c["final"]][2:]
    assert steady
    written = sum(c["state_bytes"] for c in steady)
    full = sum(c["full_state_bytes"] for c in steady)
    assert 0 < written < full  # only new SST files are uploaded
