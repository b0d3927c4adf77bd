"""A task's TaskMetrics from its TaskCounters and parts (what heartbeats and Finished carry)."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, cast

from runtime.task_metrics import TaskCounters


@dataclass
class FakeChannel:
    bytes_sent: int = 0
    blocked_seconds: float = 0.0
    pending_count: int = 0


@dataclass
class FakeInputs:
    buffered_total: int = 0
    spilled_total: int = 0


@dataclass
class FakeAssigner:
    idle: bool = False


@dataclass
class FakeChain:
    records_out: int = 0
    watermark: float = -math.inf
    assigner: FakeAssigner | None = None


@dataclass
class FakeIO:
    refused_connections: int = 0


@dataclass
class FakeInputSide:
    malformed_frames: int = 0


@dataclass
class FakeTask:
    channels: list[FakeChannel] = field(default_factory=list)
    inputs: FakeInputs | None = None
    queues: tuple[Any, ...] = (None, None)
    chain: FakeChain = field(default_factory=FakeChain)
    counters: TaskCounters = field(default_factory=TaskCounters)
    io: FakeIO = field(default_factory=FakeIO)
    input_side: FakeInputSide = field(default_factory=FakeInputSide)


def measure_task(task: FakeTask) -> Any:
    parts = (task.chain, task.channels, task.queues, task.inputs, task.io, task.input_side)
    return task.counters.measure(*cast(Any, parts))


def test_the_figures_sum_the_channels_and_queues() -> None:
    task = FakeTask(
        channels=[FakeChannel(100, 0.5, 3), FakeChannel(50, 0.25, 0)],
        inputs=FakeInputs(buffered_total=4, spilled_total=10),
        chain=FakeChain(records_out=7, watermark=12.5),
        counters=TaskCounters(
            records_in=9, bytes_in=321, idle_seconds=1.0, opened_at=time.monotonic() - 4.0
        ),
        io=FakeIO(refused_connections=2),
        input_side=FakeInputSide(malformed_frames=5),
    )
    m = measure_task(task)
    assert (m.refused_connections, m.malformed_frames) == (2, 5)
    assert (m.records_in, m.records_out, m.bytes_in, m.bytes_out) == (9, 7, 321, 150)
    assert (m.backpressure_seconds, m.output_queue, m.input_queue) == (0.75, 3, 4)
    assert m.spilled_bytes == 10 and m.watermark == 12.5
    assert 3.9 < m.uptime_seconds < 60 and m.rss_bytes > 0 and m.peak_rss >= m.rss_bytes
    assert 0 < m.busy_share < 1


def test_no_watermark_yet_and_the_end_of_time_are_not_reported() -> None:
    for wm in (-math.inf, math.inf):
        assert measure_task(FakeTask(chain=FakeChain(watermark=wm))).watermark is None


def test_an_idle_source_says_so_and_a_paused_one_counts_its_pause() -> None:
    task = FakeTask(chain=FakeChain(watermark=5.0, assigner=FakeAssigner(idle=True)))
    task.counters.aligned_pause_seconds = 1.5
    figures = measure_task(task)
    assert figures.watermark_idle and figures.aligned_pause_seconds == 1.5
    assert not measure_task(FakeTask(chain=FakeChain(watermark=5.0))).watermark_idle
    assert measure_task(FakeTask()).uptime_seconds == 0.0  # not opened yet


def test_the_peak_rss_is_kept_across_measurements() -> None:
    task = FakeTask(counters=TaskCounters(peak_rss=1 << 50))
    assert measure_task(task).peak_rss == 1 << 50 == task.counters.peak_rss


_PEAK_BETWEEN = """
from tests.runtime.test_task_metrics import FakeTask, measure_task
task = FakeTask()
before = measure_task(task).peak_rss
blob = bytearray(200 << 20)  # touched: resident
blob[:: 4096] = b"x" * len(blob[:: 4096])
del blob  # gone again before the next measurement
print(measure_task(task).peak_rss - before, measure_task(task).rss_bytes - before)
"""


def test_a_peak_between_two_measurements_is_in_the_peak_rss() -> None:
    """The kernel's high-water mark counts a 200 MiB peak that came and went between two
    heartbeats; the sampled RSS alone (the second figure) does not see it."""
    out = subprocess.run(
        [sys.executable, "-c", _PEAK_BETWEEN], capture_output=True, text=True, check=True
    ).stdout.split()
    peak_growth, rss_growth = int(out[0]), int(out[1])
    assert peak_growth > 190 << 20 and rss_growth < 50 << 20
