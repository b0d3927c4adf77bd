"""Bounded in-flight data (``max_inflight_time``, channels/debloat.py): an aligned
checkpoint taken at full load completes within a fraction of the same job's run time
without checkpoints; with fixed batches and the OS's socket buffers it does not.

The bound is a ratio, so it holds on a slow machine as on a fast one: with fixed queues a
barrier waits behind ``hops x queued records``, which is a fixed share of a job of ``n``
records whatever the machine's speed; bounded queues drain within ``max_inflight_time``
per hop, a share that shrinks as the job grows."""

from __future__ import annotations

import os
import statistics
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

from paper_topology import build, check

from jobmanager.result import JobResult
from tests.conftest import Footprint, close_dashboards

pytestmark = [pytest.mark.harness, pytest.mark.slow, pytest.mark.xdist_group("inflight")]

N = 200_000
# Half the records on one key whose task sleeps 20 µs per record: the job's bottleneck,
# so every channel up to it is full (the load at which barriers queue the longest).
SLOW = {"hot_share": 2, "slow_key": 0, "slow_seconds": 0.00002}
BOUND = 0.35  # median checkpoint duration / the run's processing time


def processing(result: JobResult) -> float:
    return result.duration - (result.startup_seconds or 0.0)


@pytest.fixture(scope="module")
def base() -> float:
    """The processing time of the job without checkpoints, on the harness as the tests'
    jobs: it sets their checkpoint interval (each test divides by its own run's time),
    taken once for the test and its companion (one worker runs the module: its group)."""
    before = Footprint.take(children=True)
    seconds = processing(build(N, 1, **SLOW).run(launcher="local"))
    close_dashboards()
    problems = before.leftovers().problems()
    assert not problems, "; ".join(problems)
    return seconds


def duration_share(base: float, **config: object) -> tuple[float, JobResult]:
    """Median duration of the checkpoints taken at full load, over the run's own
    processing time (checkpoints every ``base`` / 8: ``base`` is the processing time of
    the same job without checkpoints). The run's own time, not ``base``, divides: the
    machine's load may change between the two runs, not within one."""
    result = build(N, 1, checkpoint_interval=base / 8, **SLOW, **config).run()
    assert check(result, N), result.outputs
    # every checkpoint, the final one included: with fixed queues the first periodic
    # checkpoint can take the whole run and complete as the final one
    durations = [c.duration_ms / 1000 for c in result.checkpoints]
    assert durations, result.summary()
    return statistics.median(durations) / processing(result), result


def test_a_checkpoint_at_full_load_completes_within_a_share_of_the_run(base: float) -> None:
    share, result = duration_share(base)
    print(f"median checkpoint duration / run time: {share:.3f}")
    assert share <= BOUND, result.summary()


def test_with_fixed_batches_and_os_buffers_it_does_not(base: float) -> None:
    # The companion: the same check fails with the mechanism off (the settings before it:
    # fixed batches, 8 per side, the OS's socket buffers, TCP).
    share, result = duration_share(
        base, max_inflight_time=None, socket_buffer=0, channel_hwm=8, local_channels=False
    )
    print(f"median checkpoint duration / run time: {share:.3f}")
    assert share > BOUND, result.summary()
