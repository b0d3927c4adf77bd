"""What ``Dataflow.run()`` returns (jobmanager/result.py): picking a collect sink's
output, the derived figures, the summary's lines, a checkpoint's JSON and the superstep
recoveries' counts. (How the run's figures are gathered: test_metrics.)"""

from __future__ import annotations

import pytest

from jobmanager.failures import FailureCause
from jobmanager.result import (
    CheckpointStats,
    IterationProgress,
    JobResult,
    Restart,
    SuperstepRecovery,
)
from statebackend.metrics import AckMetrics, CheckpointSummary


def test_summary_without_restarts_says_so() -> None:
    r = JobResult("job", {}, 1.0, 10, 10, None)
    assert "restarts: 0" in r.summary() and "replayed" not in r.summary()


def test_the_output_of_the_only_sink_or_of_the_one_named() -> None:
    one = JobResult("job", {"out": [1, 2]}, 1.0, 2, 2, None)
    assert one.output() == [1, 2] == one.output("out")
    two = JobResult("job", {"a": [1], "b": [2]}, 1.0, 2, 2, None)
    assert two.output("b") == [2]
    with pytest.raises(KeyError, match=r"collect sinks \['a', 'b'\]; name one"):
        two.output()
    with pytest.raises(KeyError, match=r"no collect sink named 'c'; collect sinks: \['a', 'b'\]"):
        two.output("c")


def test_throughput_of_a_run_without_duration_is_zero() -> None:
    assert JobResult("job", {}, 0.0, 10, 10, None).records_per_second == 0.0
    assert JobResult("job", {}, 4.0, 10, 10, None).records_per_second == 2.5


def stats(n: int, final: bool = False, written: int = 10**6, full: int = 10**6) -> CheckpointStats:
    summary = CheckpointSummary(state_bytes=written, full_state_bytes=full, alignment_ms=float(n))
    return CheckpointStats(n, final, 10.0 * n, summary)


def test_the_summary_says_how_it_stopped_what_restarted_and_what_was_incremental() -> None:
    r = JobResult("etl", {}, 2.0, 1000, 990, 1.5, savepoint="/chk/savepoint-7")
    r.checkpoints = [stats(1, written=10**6, full=4 * 10**6), stats(2), stats(3, final=True)]
    r.restarts = [Restart(0, FailureCause.TASK_DIED, "count[1] died", 2, 100.0, resumed_at=101.25)]
    lines = r.summary().splitlines()
    assert lines[0] == "job 'etl': 1,000 records in, 990 out (committed) in 2.00 s (500 records/s)"
    assert "  stopped with savepoint /chk/savepoint-7" in lines
    assert "  start-up (submit -> first record): 1.50 s" in lines
    assert any(line.startswith("  checkpoints: 2 completed + final, 0 failed") for line in lines)
    assert (
        "  state per checkpoint (median): 1.00 MB written, 1.00 MB in all (incremental)"
        not in lines
    )
    assert (
        "  restart after attempt 0 failed (count[1] died): restored checkpoint 2, "
        "processing again after 1.25 s"
    ) in lines
    assert "restarts: 0" not in r.summary()
    stopped = JobResult("etl", {}, 1.0, 1, 1, None, stopped=True)
    assert "  stopped (no checkpointing: no savepoint)" in stopped.summary().splitlines()


def test_the_summary_shows_incremental_state_when_checkpoints_wrote_less_than_they_hold() -> None:
    r = JobResult("etl", {}, 1.0, 1, 1, None)
    r.checkpoints = [stats(n, written=10**6, full=5 * 10**6) for n in (1, 2, 3)]
    assert "  state per checkpoint (median): 1.00 MB written, 5.00 MB in all (incremental)" in (
        r.summary().splitlines()
    )


def test_recovery_seconds_are_known_once_the_next_attempt_processes_again() -> None:
    restart = Restart(1, FailureCause.TASK_DIED, "died", None, failed_at=50.0)
    assert restart.recovery_seconds is None
    restart.resumed_at = 52.5
    assert restart.recovery_seconds == 2.5


def test_a_checkpoints_json_leaves_out_the_committed_counts_nobody_reported() -> None:
    tasks = {"count[0]": AckMetrics(alignment_ms=0.5)}
    known = CheckpointStats(4, False, 12.0, CheckpointSummary(), tasks, 100, 90).encode()
    assert (
        known["checkpoint_id"],
        known["committed_records_in"],
        known["committed_records_out"],
    ) == (4, 100, 90)
    assert known["tasks"] == {"count[0]": tasks["count[0]"].encode()}
    unknown = CheckpointStats(4, True, 12.0, CheckpointSummary()).encode()
    assert "committed_records_in" not in unknown and unknown["final"] is True


def test_the_supersteps_run_again_are_summed_over_the_recoveries() -> None:
    progress = IterationProgress()
    progress.recoveries += [SuperstepRecovery(7, 5), SuperstepRecovery(3, 0)]
    assert [r.rerun for r in progress.recoveries] == [2, 3] and progress.rerun == 5
