"""Fault injection on the test harness (a few tests on local Spark): real SIGKILLs of
task processes (and a raising UDF); every run's output must equal a failure-free run's,
record for record."""

from __future__ import annotations

import collections
import logging
import os
import signal
from typing import Any

import pytest

from jobmanager.failures import FailureCause
from jobmanager.faults import Kill, RaiseAt, RandomKills
from runtime import Dataflow, TaskFailedError
from runtime.sources import GeneratorSource
from statebackend.errors import CheckpointNotFoundError
from tests.integration.topologies import (
    corpus_counts,
    diamond,
    diamond_expected,
    final_counts,
    pipeline,
    pipeline_expected,
    read_part_files,
    slow_branch,
    slow_words,
    write_corpus,
)

# On the test harness (local task processes, real SIGKILLs); tests marked integration
# run on local Spark (see tests/conftest.py).
pytestmark = [pytest.mark.harness, pytest.mark.slow]

CHK: dict[str, Any] = {"checkpoint_interval": 0.1}


def multiset(records: list[Any]) -> collections.Counter[Any]:
    return collections.Counter(records)


@pytest.mark.integration  # also on local Spark
def test_wordcount_survives_a_killed_counter(tmp_path: Any) -> None:
    paths = write_corpus(str(tmp_path), 120_000)
    reference = slow_words(paths, **CHK).run()
    result = slow_words(paths, **CHK).run(faults=[Kill("count[1]", after_checkpoint=2)])
    assert len(result.restarts) == 1 and result.restarts[0].restored_checkpoint is not None, (
        result.summary()
    )
    assert multiset(result.output("counts")) == multiset(reference.output("counts"))
    assert final_counts(result.output("counts")) == corpus_counts(paths)


def test_diamond_with_two_shuffles_survives_a_kill() -> None:
    # 3.2 s of input (was 1.6 s, the shortest kill test): the kill waits for checkpoint 2,
    # which a busy 2-core machine can delay by over a second with 16 tasks to schedule
    n = 16_000
    result = diamond(n, rate=5_000, **CHK).run(faults=[Kill("count5[1]", after_checkpoint=2)])
    assert len(result.restarts) == 1, result.summary()
    expected = diamond_expected(n)
    assert multiset(result.output("totals")) == expected["totals"]
    assert multiset(result.output("by5")) == expected["by5"]


@pytest.mark.integration  # also on local Spark
def test_a_task_on_another_host_kills_itself_when_asked(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As on a cluster: the job manager cannot signal the task's pid, so it sends KillSelf,
    and learns of the death from Spark's failed stage (no pid checks on other hosts)."""
    from jobmanager.liveness import Liveness

    monkeypatch.setattr(Liveness, "is_local", lambda self, task: False)
    n = 16_000
    with caplog.at_level(logging.WARNING, logger="absflow.jobmanager"):
        result = pipeline(n, **CHK).run(faults=[Kill("count[1]", after_checkpoint=2)])
    assert "asked to signal itself" in caplog.text
    assert len(result.restarts) == 1, result.summary()
    assert result.restarts[0].restored_checkpoint is not None
    assert multiset(result.output("out")) == pipeline_expected(n)


@pytest.mark.parametrize("task", ["numbers[0]", "square[1]", "count[0]", "out[0]"])
def test_kill_source_middle_keyed_and_sink_tasks(task: str) -> None:
    n = 16_000
    result = pipeline(n, **CHK).run(faults=[Kill(task, after_checkpoint=2)])
    assert len(result.restarts) == 1, result.summary()
    assert result.restarts[0].restored_checkpoint is not None
    assert multiset(result.output("out")) == pipeline_expected(n)


def test_kill_during_alignment() -> None:
    n = 20_000
    reference = slow_branch(n, **CHK).run()
    result = slow_branch(n, **CHK).run(
        faults=[Kill("merge[0]", during="alignment", after_checkpoint=2)]
    )
    assert len(result.restarts) == 1, result.summary()
    assert multiset(result.output("counts")) == multiset(reference.output("counts"))


def test_kill_during_snapshot_write_restores_the_previous_checkpoint(tmp_path: Any) -> None:
    n = 16_000
    result = pipeline(n, checkpoint_dir=str(tmp_path / "chk"), **CHK).run(
        faults=[Kill("count[1]", during="snapshot", after_checkpoint=2)]
    )
    assert len(result.restarts) == 1, result.summary()
    assert result.restarts[0].restored_checkpoint == 1  # checkpoint 2 never completed
    assert multiset(result.output("out")) == pipeline_expected(n)


def test_three_kills_in_one_run() -> None:
    n = 20_000
    faults = [
        Kill("count[0]", after_seconds=0.6, attempt=0),
        Kill("numbers[1]", after_seconds=0.6, attempt=1),
        Kill("out[0]", after_seconds=0.6, attempt=2),
    ]
    result = pipeline(n, **CHK).run(faults=faults)
    assert len(result.restarts) == 3, result.summary()
    assert multiset(result.output("out")) == pipeline_expected(n)


def test_random_kills() -> None:
    n = 24_000
    result = pipeline(n, **CHK).run(
        faults=[RandomKills(2, seed=11, min_seconds=0.3, max_seconds=0.9)]
    )
    assert len(result.restarts) == 2, result.summary()
    assert multiset(result.output("out")) == pipeline_expected(n)


def test_udf_raising_once_is_recovered() -> None:
    n = 10_000
    result = pipeline(n, **CHK).run(faults=[RaiseAt("square", record=3_000, subtask=0)])
    assert len(result.restarts) == 1, result.summary()
    assert "raised" in result.restarts[0].reason
    assert multiset(result.output("out")) == pipeline_expected(n)


def test_without_blocking_the_same_kill_gives_wrong_counts() -> None:
    """Companion: barriers forwarded but channels not blocked (at-least-once) -> the
    kill makes records after a barrier count twice. The check above catches it."""
    n = 20_000
    reference = slow_branch(n, **CHK).run()
    exact = slow_branch(n, **CHK).run(faults=[Kill("count[0]", after_checkpoint=1)])
    assert len(exact.restarts) == 1
    assert multiset(exact.output("counts")) == multiset(reference.output("counts"))
    for _ in range(3):
        loose = slow_branch(n, snapshot_mode="at_least_once", **CHK).run(
            faults=[Kill("count[0]", after_checkpoint=1)]
        )
        assert len(loose.restarts) == 1
        # The setting that makes alignment matter: at the restored checkpoint the two
        # barriers reached "merge" far apart (else nothing could be counted twice; the
        # lagging source answers within its ~0.8 s batch, rarely at once: run again).
        restored = loose.restarts[0].restored_checkpoint
        skew = [
            c.summary.max_alignment_ms for c in loose.checkpoints if c.checkpoint_id == restored
        ]
        if skew and skew[0] > 30:
            break
    else:
        pytest.fail("three runs without barrier skew at the restored checkpoint")
    duplicates = len(loose.output("counts")) - len(reference.output("counts"))
    assert multiset(loose.output("counts")) != multiset(reference.output("counts")), (
        "without blocking, the restored state should already hold post-barrier records "
        "that the sources replay; the output should differ from the failure-free run"
    )
    assert duplicates > 0


def test_restore_from_falls_back_past_a_corrupt_latest_checkpoint(
    tmp_path: Any, caplog: Any
) -> None:
    root = tmp_path / "chk"
    n = 10_000
    # State files, not inline states: this corrupts one on disk (inline states are
    # checked the same way, tests/statebackend/test_inline_state.py).
    first = pipeline(
        n, checkpoint_dir=str(root), state_inline_threshold=0, retained_checkpoints=100, **CHK
    ).run()
    final_id = first.checkpoints[-1].checkpoint_id
    total_out = first.checkpoints[-1].committed_records_out
    assert total_out is not None
    # The checkpoint the fallback must reach: the latest one after which the sink still got
    # output (a periodic checkpoint can land after the last record, just before the final
    # one; restoring it would replay nothing and prove nothing). Every newer one is corrupt.
    previous = max(
        c.checkpoint_id
        for c in first.checkpoints
        if c.committed_records_out is not None and c.committed_records_out < total_out
    )
    for corrupt_id in range(previous + 1, final_id + 1):
        state_files = sorted((root / f"chk-{corrupt_id}").glob("*.state"))
        data = bytearray(state_files[0].read_bytes())
        data[len(data) // 2] ^= 0xFF
        state_files[0].write_bytes(bytes(data))
    # and a newer half-written one, as a kill during a snapshot leaves it
    (root / f"chk-{final_id + 1}").mkdir()
    (root / f"chk-{final_id + 1}" / "count[0].state").write_bytes(b"ABSF-partial")
    with caplog.at_level(logging.WARNING, logger="absflow"):
        resumed = pipeline(n, checkpoint_dir=str(tmp_path / "chk2"), **CHK).run(
            restore_from=str(root)
        )
    assert any(
        f"chk-{final_id}" in r.getMessage() or f"checkpoint {final_id}" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
    assert multiset(first.output("out")) == pipeline_expected(n)
    # The fallback restored exactly the previous checkpoint: the same output, record for
    # record, as restoring that checkpoint by name; and it is the part of the first run's
    # output committed after that checkpoint (non-empty: chosen so above).
    explicit = pipeline(n, checkpoint_dir=str(tmp_path / "chk3"), **CHK).run(
        restore_from=str(root / f"chk-{previous}")
    )
    resumed_out = multiset(resumed.output("out"))
    assert resumed_out and resumed_out == multiset(explicit.output("out"))
    assert not resumed_out - multiset(first.output("out"))


def test_missing_restore_from_path_is_a_clear_error(tmp_path: Any) -> None:
    missing = tmp_path / "no-such-checkpoint"
    with pytest.raises(CheckpointNotFoundError) as info:
        pipeline(10, **CHK).run(restore_from=str(missing))
    assert str(missing) in str(info.value)
    assert not os.path.exists(missing)


def test_a_frozen_task_is_detected_by_missing_heartbeats() -> None:
    n = 12_000
    result = pipeline(n, heartbeat_timeout=1.5, **CHK).run(
        faults=[Kill("count[1]", after_seconds=0.5, signal=signal.SIGSTOP)]
    )
    assert len(result.restarts) == 1, result.summary()
    assert "heart" in result.restarts[0].reason
    assert multiset(result.output("out")) == pipeline_expected(n)


def test_blocked_channels_spill_to_disk_and_replay_in_order() -> None:
    n = 20_000
    reference = slow_branch(n, **CHK).run()
    result = slow_branch(n, spill_threshold=1024, **CHK).run()
    assert sum(c.summary.spilled_bytes for c in result.checkpoints) > 0
    assert multiset(result.output("counts")) == multiset(reference.output("counts"))


def test_file_sink_output_is_exactly_once_under_kills(tmp_path: Any) -> None:
    n = 20_000  # 2.5 s of input: both kills land well before the end, also on a busy machine
    out = str(tmp_path / "out")
    result = pipeline(n, files=out, **CHK).run(
        faults=[
            Kill("files[1]", after_checkpoint=1),
            Kill("count[0]", after_seconds=0.5, attempt=1),
        ]
    )
    assert len(result.restarts) == 2, result.summary()
    assert read_part_files(out) == pipeline_expected(n)
    assert (result.records_in, result.records_out) == (n, n), result.summary()
    assert not [p for p in os.listdir(out) if p.endswith(".staging")]  # no leftovers


def test_committed_counts_after_a_kill_are_the_exact_figures() -> None:
    """records_in/out are exactly-once: every source record once, every sink record once
    (here each of the n records gives one running count); the replayed work is apart."""
    n = 16_000
    result = pipeline(n, **CHK).run(faults=[Kill("count[0]", after_checkpoint=2)])
    assert len(result.restarts) == 1, result.summary()
    restored = result.restarts[0].restored_checkpoint
    assert restored is not None
    assert len(result.output("out")) == n
    assert (result.records_in, result.records_out) == (n, n), result.summary()
    at_restore = next(c for c in result.checkpoints if c.checkpoint_id == restored)
    assert at_restore.committed_records_in is not None
    assert 0 < at_restore.committed_records_in < n
    assert result.records_per_second == pytest.approx(n / result.duration)
    # every completed checkpoint of both attempts is counted, and the summary says so
    assert result.checkpoints_completed >= 3
    assert f"{result.checkpoints_completed} completed + final" in result.summary()
    assert result.restarts[0].cause is FailureCause.TASK_DIED
    assert "operator 'count' (subtask 0)" in result.restarts[0].reason


def test_a_checkpoint_kill_of_a_later_attempt_fires_after_the_restore() -> None:
    n = 20_000
    result = pipeline(n, **CHK).run(
        faults=[
            Kill("count[0]", after_checkpoint=2),
            Kill("numbers[1]", after_checkpoint=3, attempt=1),
        ]
    )
    assert len(result.restarts) == 2 and not result.unfired_faults, result.summary()
    first, second = (r.restored_checkpoint or 0 for r in result.restarts)
    assert second > first >= 2  # attempt 1 completed a checkpoint of its own first
    assert multiset(result.output("out")) == pipeline_expected(n)


def test_three_random_kills_land_in_a_few_seconds_job() -> None:
    n = 32_000  # 4 s at 8,000 records/s
    result = pipeline(n, checkpoint_interval=0.5).run(faults=[RandomKills(3, seed=5)])
    assert len(result.restarts) == 3 and not result.unfired_faults, result.summary()
    assert all(r.restored_checkpoint is not None for r in result.restarts)
    assert multiset(result.output("out")) == pipeline_expected(n)
    assert (result.records_in, result.records_out) == (n, n)


def _explode(x: int) -> int:
    if x == 5_000:
        raise ValueError("bad record 5000")
    return x


@pytest.mark.integration  # also on local Spark
def test_a_udf_that_always_raises_fails_fast_and_says_why() -> None:
    flow = Dataflow("always", parallelism=2, checkpoint_interval=0.1)
    (
        flow.source(GeneratorSource(lambda i: i, 20_000, rate=8_000), name="numbers")
        .rebalance()
        .map(_explode, name="explode")
        .collect("out")
    )
    with pytest.raises(TaskFailedError) as info:
        flow.run()
    message = str(info.value)
    assert info.value.operator == "explode"
    assert "a user function raised in operator 'explode'" in message
    assert "ValueError: bad record 5000" in message
    assert "failed the same way twice after" in message
    assert "not retried, a restart cannot fix it" in message


def test_an_unfired_kill_is_reported_with_the_summarys_checkpoint_count() -> None:
    result = pipeline(4_000, **CHK).run(faults=[Kill("count[0]", after_seconds=60)])
    assert result.restarts == [] and len(result.unfired_faults) == 1, result.summary()
    note = result.unfired_faults[0]
    assert note.startswith("Kill('count[0]', after_seconds=60, attempt=0): attempt 0 finished")
    assert f"{result.checkpoints_completed} checkpoint(s) completed in the run" in note
    assert f"checkpoints: {result.checkpoints_completed} completed + final" in result.summary()
    assert (result.records_in, result.records_out) == (4_000, 4_000)
