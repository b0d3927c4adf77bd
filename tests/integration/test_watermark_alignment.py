"""Watermark alignment end to end, on the harness: two source subtasks, one fast and one
slow (each of its records takes half a millisecond to read). Event time is the record
number in ms. Downstream, one running aggregate sees both subtasks' records in arrival
order and keeps the largest gap between them: with ``max_drift`` the fast subtask
pauses while it is ahead, so the gap stays near the drift; the companion without it
lets the fast subtask run through all its input first, and the gap grows to nearly the
whole event time. Both count every record once."""

from __future__ import annotations

import time
from typing import Any

import pytest

from jobmanager.faults import Kill
from runtime import Dataflow
from runtime.sources import GeneratorSource

pytestmark = [pytest.mark.harness]

N = 8_000  # records; subtask 0 reads the even ones at once, subtask 1 the odd ones slowly
DRIFT = 500  # ms of event time


def record(i: int) -> int:
    if i % 2:  # the slow subtask
        deadline = time.perf_counter() + 0.0005
        while time.perf_counter() < deadline:
            pass
    return i


def widest_gap(state: tuple[int, int, int, int], i: int) -> tuple[int, int, int, int]:
    """(records, highest even, highest odd, widest gap between the two seen so far)."""
    n, even, odd, gap = state
    if i % 2:
        odd = max(odd, i)
    else:
        even = max(even, i)
    if even >= 0 and odd >= 0:
        gap = max(gap, even - odd)
    return n + 1, even, odd, gap


def run(max_drift: float | None, **options: Any) -> tuple[tuple[int, int, int, int], Any]:
    config = {"batch_size": 50, "heartbeat_interval": 0.05, **options.pop("config", {})}
    flow = Dataflow("aligned", parallelism=2, **config)
    stream = flow.source(GeneratorSource(record, N), name="numbers").assign_timestamps(
        lambda i: i, max_drift=max_drift, name="ts"
    )
    gaps = stream.key_by(lambda _i: 0).aggregate((0, -1, -1, 0), widest_gap, name="gaps")
    gaps.map(lambda kv: kv[1], name="state").collect("out")
    result = flow.run(progress=False, **options)
    final = max(result.output("out"))  # the state after the last record: the most records
    return final, result


def test_aligned_sources_stay_within_the_drift_and_count_every_record_once() -> None:
    final, result = run(DRIFT)
    n, _even, _odd, gap = final
    assert n == N
    # the drift, plus what the slow subtask reads between two heartbeat answers, a batch
    # of the fast one, and the slow one's batches in flight
    assert gap < 6 * DRIFT, final
    fast, slow = (result.task_metrics[f"numbers[{i}]"].aligned_pause_seconds for i in (0, 1))
    print(f"gap {gap} ms; paused: fast {fast:.2f} s, slow {slow:.2f} s")
    assert fast > 10 * slow  # the slow one waits only until the fast one's first report


def test_companion_without_alignment_the_fast_subtask_runs_far_ahead() -> None:
    final, result = run(None)
    n, _even, _odd, gap = final
    assert n == N
    print(f"gap {gap} ms")
    assert gap > 8 * DRIFT, final  # more than the aligned bound: the check can fail
    assert all(m.aligned_pause_seconds == 0 for m in result.task_metrics.values())


def test_a_killed_aligned_source_resumes_aligned_and_counts_every_record_once() -> None:
    """After the restore the sources' watermarks are unknown to the new attempt's job
    manager until they report: the restored fast subtask waits, then goes on aligned."""
    final, result = run(
        DRIFT,
        config={"checkpoint_interval": 0.2},
        faults=[Kill("numbers[0]", after_checkpoint=2)],
    )
    assert result.unfired_faults == [] and len(result.restarts) == 1
    n, _even, _odd, gap = final
    assert n == N  # exactly once across the restore
    assert gap < 6 * DRIFT, final
