"""Per-split watermarks end to end, on the harness: one source subtask interleaves three
splits (`runtime.split_sources.SplitsSource`). A split that lags in event time holds the
watermark back, so none of its records is late (window counts equal a direct
computation); a split that goes quiet stops holding it after ``idle_timeout`` (windows
fire while it is quiet) and holds it again when it resumes. Companions: a reader that
reports no splits drops the lagging split's records as late; without ``idle_timeout``
no window fires while the split is quiet."""

from __future__ import annotations

import collections
import os
import time
from pathlib import Path
from typing import Any

import pytest

from runtime import Dataflow
from runtime.sources import SourceReader
from runtime.split_sources import SplitsSource
from runtime.window_kinds import Tumbling

pytestmark = [pytest.mark.harness]

SIZE = 1_000
COUNT = 3_000  # records per split
QUIET_AT, QUIET_S = 100, 3.0  # split 2 goes quiet before its record 100, for 3 s
JUMP = 100_000  # split 2 resumes with fresh event time (nothing of it is late)
STAMPS = "ABSFLOW_TEST_SPLIT_STAMPS"


def record_ts(split: int, i: int) -> tuple[str, int, int]:
    """Split 0: ts 10 i; split 1 lags: ts 5 i; split 2: ts 10 i, then a jump."""
    ts = 5 * i if split == 1 else 10 * i + (JUMP if split == 2 and i >= QUIET_AT else 0)
    return (f"s{split}k{i % 3}", ts, split)


def record(split: int, i: int) -> tuple[str, int, int]:
    if split == 2 and i == QUIET_AT:
        with open(os.environ[STAMPS], "a") as fh:  # when split 2 resumed (task process)
            fh.write(f"resumed {time.monotonic()}\n")
    return record_ts(split, i)


def witness(result: Any) -> Any:
    with open(os.environ[STAMPS], "a") as fh:
        fh.write(f"window {result[2]} {time.monotonic()}\n")
    return result


class NoSplits(SplitsSource):
    """The companion: the same records, but the reader reports no split (one watermark
    for the whole subtask, from the highest timestamp of every split)."""

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        reader = super().create_reader(subtask, parallelism)
        reader.current_split = lambda: None  # type: ignore[method-assign]
        return reader


def build(source: SplitsSource, idle_timeout: float | None) -> Dataflow:
    flow = Dataflow("splits", parallelism=1, batch_size=50)
    windows = (
        flow.source(source, name="splits", parallelism=1)
        .assign_timestamps(lambda r: r[1], max_delay=100, idle_timeout=idle_timeout, name="ts")
        .key_by(lambda r: r[0])
        .window(Tumbling(SIZE), name="w", late_output="late")
    )
    windows.count().map(witness, name="witness").collect("out")
    windows.late.collect("late")
    return flow


def direct() -> collections.Counter[Any]:
    counts: collections.Counter[Any] = collections.Counter()
    for split in range(3):
        for i in range(COUNT):
            key, ts, _ = record_ts(split, i)
            counts[(key, ts - ts % SIZE, ts - ts % SIZE + SIZE)] += 1
    return collections.Counter({(k, s, e, n): 1 for (k, s, e), n in counts.items()})


def source(cls: type[SplitsSource] = SplitsSource) -> SplitsSource:
    return cls(record, [COUNT] * 3, batch=50, pauses={2: [(QUIET_AT, QUIET_S)]}, every=0.005)


def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, src: SplitsSource, idle: Any) -> Any:
    stamps = tmp_path / "stamps.txt"
    monkeypatch.setenv(STAMPS, str(stamps))
    result = build(src, idle).run(progress=False)
    lines = [line.split() for line in stamps.read_text().splitlines()]
    resumed = next(float(t) for what, *rest, t in lines if what == "resumed")
    fired_while_quiet = [
        int(end) for what, end, t in (x for x in lines if x[0] == "window") if float(t) < resumed
    ]
    return result, fired_while_quiet


def test_a_lagging_split_holds_the_watermark_and_a_quiet_one_stops_holding_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, fired_while_quiet = run(tmp_path, monkeypatch, source(), 0.2)
    assert result.output("late") == []  # the lagging split held the watermark back
    assert collections.Counter(result.output("out")) == direct()
    # split 2 went quiet at event time ~990: windows past it fired before it resumed
    assert max(fired_while_quiet, default=0) > 2 * SIZE


def test_companion_without_idleness_the_quiet_split_holds_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, fired_while_quiet = run(tmp_path, monkeypatch, source(), None)
    assert collections.Counter(result.output("out")) == direct()
    assert max(fired_while_quiet, default=0) <= 2 * SIZE


def test_companion_one_watermark_for_all_splits_makes_the_lagging_split_late(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, _ = run(tmp_path, monkeypatch, source(NoSplits), 0.2)
    assert result.output("late")  # split 1's records fell behind the subtask's watermark
    assert {r[2] for r in result.output("late")} == {1}
