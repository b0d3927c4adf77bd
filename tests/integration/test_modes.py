"""Snapshot modes on the test harness (one test on local Spark) with real SIGKILLs:
unaligned checkpoints, aligned ones with a timeout and synchronous ones give output equal
to a failure-free run, record for record; the channel state the first two log is what
makes that so (the companion drops it on restore)."""

from __future__ import annotations

import collections
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jobmanager.faults import Kill
from runtime import Dataflow, TaskFailedError
from runtime.sources import GeneratorSource
from statebackend.errors import IncompatibleCheckpointError
from statebackend.storage import CheckpointStorage
from tests.integration.topologies import diamond, diamond_expected, pipeline, pipeline_expected

# On the test harness (local task processes); tests marked integration run on local
# Spark (see tests/conftest.py).
pytestmark = [pytest.mark.harness, pytest.mark.slow]

MODES: dict[str, dict[str, Any]] = {
    "unaligned": {"snapshot_mode": "unaligned"},
    # A timeout this short switches nearly every checkpoint to unaligned half way.
    "aligned_timeout": {"aligned_timeout": 0.002},
    "synchronous": {"snapshot_mode": "synchronous"},
}


def channel_state(result: Any) -> int:
    return sum(c.summary.channel_state_records for c in result.checkpoints)


def exact(result: Any, n: int) -> bool:
    expected = diamond_expected(n)
    return collections.Counter(result.output("totals")) == expected["totals"] and (
        collections.Counter(result.output("by5")) == expected["by5"]
    )


@pytest.mark.parametrize("mode", list(MODES))
def test_a_killed_join_task_recovers_exactly(mode: str) -> None:
    n = 30_000
    flow = diamond(n, rate=10_000, checkpoint_interval=0.1, **MODES[mode])
    result = flow.run(faults=[Kill("per_key[1]", after_checkpoint=3)])
    assert len(result.restarts) == 1, result.summary()
    assert result.restarts[0].restored_checkpoint is not None
    if mode != "synchronous":
        assert channel_state(result) > 0, "no checkpoint logged channel state: nothing tested"
    assert exact(result, n)


@pytest.mark.integration  # also on local Spark
def test_unaligned_kills_of_every_kind_of_task() -> None:
    n = 16_000
    faults = [
        Kill("count[0]", after_checkpoint=2),
        Kill("square[1]", after_checkpoint=4, attempt=1),
        Kill("out[0]", after_checkpoint=6, attempt=2),
    ]
    result = pipeline(n, checkpoint_interval=0.1, snapshot_mode="unaligned").run(faults=faults)
    assert len(result.restarts) == 3, result.summary()
    assert collections.Counter(result.output("out")) == pipeline_expected(n)


def test_the_channel_state_matters() -> None:
    """Restoring unaligned checkpoints without their channel state loses records: the
    exactly-once result above is the replayed channel state's doing."""
    n = 30_000
    for after in (3, 4, 5):
        flow = diamond(n, rate=10_000, checkpoint_interval=0.1, snapshot_mode="unaligned")
        result = flow.run(
            faults=[Kill("per_key[1]", after_checkpoint=after)], debug_drop_in_flight_log=True
        )
        restored = result.restarts[0].restored_checkpoint if result.restarts else None
        logged = next(
            (
                c.summary.channel_state_records
                for c in result.checkpoints
                if c.checkpoint_id == restored
            ),
            0,
        )
        if logged:
            assert not exact(result, n), "dropping the channel state changed nothing"
            return
    pytest.fail("no restored checkpoint had channel state in three tries")


def test_an_unaligned_checkpoint_refuses_another_parallelism(tmp_path: Path) -> None:
    n = 20_000
    chk = str(tmp_path / "chk")
    flow = diamond(n, rate=10_000, checkpoint_interval=0.1, snapshot_mode="unaligned")
    result = flow.run(checkpoint_dir=chk, retained_checkpoints=50)
    assert exact(result, n)
    # Some retained checkpoint logged channel state for 'per_key' at parallelism 2.
    with_state = [c.checkpoint_id for c in result.checkpoints if c.summary.channel_state_records]
    assert with_state, result.summary()
    rescaled = diamond(n, checkpoint_interval=0.1, snapshot_mode="unaligned")
    for step in rescaled.graph.steps:
        if step.name in ("per_key", "totals"):
            step.parallelism = 3
    with pytest.raises((IncompatibleCheckpointError, TaskFailedError), match="in-flight records"):
        rescaled.run(restore_from=f"{chk}/chk-{with_state[-1]}")


def test_the_cli_shows_each_checkpoints_mode_and_channel_state(tmp_path: Path) -> None:
    chk = str(tmp_path / "chk")
    diamond(10_000, rate=10_000, checkpoint_interval=0.1, snapshot_mode="unaligned").run(
        checkpoint_dir=chk
    )
    done = subprocess.run(
        [sys.executable, "-m", "jobmanager", "checkpoints", chk],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    header, *rows = [line.split() for line in done.stdout.splitlines()[1:] if line.strip()]
    assert "mode" in header and header[-1] == "channel_state_bytes"
    completed = [r for r in rows if "completed" in r]
    assert completed and all(r[header.index("mode")] == "unaligned" for r in completed)


def _slow_odd(x: int) -> int:
    if x % 2:
        time.sleep(0.0001)  # one slow keyed task: backpressure up to the sources
    return x


def backlogged(n: int, mode: str, directory: Path) -> Dataflow:
    flow = Dataflow(
        "cut",
        parallelism=2,
        checkpoint_interval=0.1,
        snapshot_mode=mode,
        checkpoint_dir=str(directory),
        retained_checkpoints=1000,
    )
    numbers = flow.source(GeneratorSource(lambda i: i, n, rate=n / 2), name="numbers")
    numbers.key_by(lambda x: x % 2).map(_slow_odd, name="slow").collect("out")
    return flow


@pytest.mark.parametrize("mode", ["exactly_once", "unaligned"])
def test_every_snapshot_is_a_consistent_cut(mode: str, tmp_path: Path) -> None:
    """Chandy-Lamport's invariant, per checkpoint: every record the sources sent before
    their snapshot was processed by the slow stage before its snapshot, or is in its
    channel state. Aligned: never any channel state. Unaligned, under backpressure: the
    barrier overtook records queued for the slow task, which the channel state holds."""
    n = 40_000
    result = backlogged(n, mode, tmp_path).run()
    assert sorted(result.output("out")) == list(range(n))
    storage = CheckpointStorage(str(tmp_path))
    overtaken = 0
    ids = storage.checkpoint_ids()
    assert len(ids) >= 3, result.summary()
    for n_id in ids:
        tasks = storage.read_metadata(n_id).task_metrics
        sent = sum(m.records_out for t, m in tasks.items() if t.startswith("numbers"))
        slow = [m for t, m in tasks.items() if t.startswith("slow")]
        assert len(slow) == 2 and sent > 0, sorted(tasks)
        processed = sum(m.records_in for m in slow)
        in_flight = sum(m.channel_state_records for m in slow)
        assert processed + in_flight == sent, (n_id, processed, in_flight, sent)
        overtaken += in_flight
    if mode == "exactly_once":
        assert overtaken == 0
    else:
        assert overtaken > 0, "no barrier overtook a record: the invariant held trivially"


def snapshots_after_the_drain(directory: Path) -> tuple[int, int]:
    """(tasks' snapshots checked, snapshots of tasks that processed records after the
    job was proven drained): synchronous checkpoints record each task's counts when the
    drain was proven, and every ack the task's counts at its snapshot."""
    storage = CheckpointStorage(str(directory))
    checked = moved = 0
    for n_id in storage.checkpoint_ids():
        for task, m in storage.read_metadata(n_id).task_metrics.items():
            if m.drained_received is not None and not task.startswith("numbers"):
                checked += 1
                moved += m.records_in != m.drained_received
    return checked, moved


def test_no_task_processes_a_record_during_a_synchronous_snapshot(tmp_path: Path) -> None:
    """Naiad's baseline: every source halts, the job drains, then every task snapshots.
    A task's count at its snapshot equals its count when the drain was proven."""
    n = 40_000
    result = backlogged(n, "synchronous", tmp_path).run()
    assert sorted(result.output("out")) == list(range(n))
    checked, moved = snapshots_after_the_drain(tmp_path)
    assert checked >= 4 and moved == 0, (checked, moved, result.summary())
    halts = [(c.summary.halt_ms, c.summary.drain_ms) for c in result.checkpoints if not c.final]
    assert all(h is not None and d is not None and h >= d for h, d in halts), halts


def test_without_the_drain_tasks_snapshot_while_records_move(tmp_path: Path) -> None:
    """The companion: trigger at the halt (only the sources paused, the old baseline) and
    the slow tasks are still working off their backlog when their barrier comes."""
    n = 40_000
    flow = backlogged(n, "synchronous", tmp_path)
    result = flow.run(debug_skip_drain=True)
    assert sorted(result.output("out")) == list(range(n))
    checked, moved = snapshots_after_the_drain(tmp_path)
    assert checked and moved > 0, (checked, moved)
