"""Event time at a stop with a savepoint, on the harness: a plain stop leaves open
windows un-fired in the savepoint (nothing fires after the final barrier, where its
output would never commit), and stop + resume gives one uninterrupted run's output; a
stop with drain fires every window before the savepoint, so the stopped run's output is
every window of the records it read."""

from __future__ import annotations

import ast
import collections
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from jobmanager.stop import request_stop, running_jobs
from runtime import Dataflow
from runtime.sources import GeneratorSource
from runtime.window_kinds import Tumbling

pytestmark = [pytest.mark.harness]

KEYS = 5
SIZE = 1_000  # event-time window size; 100 records per window
# The resumed run ends here. The stopped run reads at 3,000 records/s until its stop,
# which waits for two completed checkpoints: usually ~1,600 records, but a slow
# checkpoint on a busy machine delayed it past 6,000 (10,683 seen), and then the resumed
# run, bounded below what was read, cannot equal one run. 10 s of input is the margin.
N = 30_000


def event(i: int) -> tuple[str, int, int]:
    """Out of order by < 40 (below max_delay)."""
    return (f"k{i % KEYS}", i * 10 + (i * 7919) % 40, i)


def windows_of(records: list[tuple[str, int, int]]) -> collections.Counter[Any]:
    counts: collections.Counter[Any] = collections.Counter()
    for key, ts, _ in records:
        start = ts - ts % SIZE
        counts[(key, start, start + SIZE)] += 1
    return collections.Counter({(k, s, e, n): 1 for (k, s, e), n in counts.items()})


def build(count: int | None, seen: Path, chk: Path, rate: float | None = None) -> Dataflow:
    def witness(result: Any) -> Any:
        """Every window result that leaves the window step, committed or not."""
        with open(seen, "a") as fh:
            fh.write(repr(tuple(result)) + "\n")
        return result

    flow = Dataflow(
        "stop_windows",
        parallelism=2,
        batch_size=50,
        checkpoint_interval=0.2,
        checkpoint_dir=str(chk),
    )
    events = flow.source(
        GeneratorSource(event, count, rate=rate), name="events", parallelism=1
    ).assign_timestamps(lambda r: r[1], max_delay=50, name="ts")
    events.collect("read", parallelism=1)  # the records read (committed with the windows)
    (
        events.key_by(lambda r: r[0])
        .window(Tumbling(SIZE), name="per_window")
        .count()
        .map(witness, name="witness")
        .collect("out")
    )
    return flow


def stop_after_a_checkpoint(chk: Path, drain: bool) -> threading.Thread:
    def stop() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            jobs = [j for j in running_jobs() if j.job == "stop_windows"]
            if jobs and len(list(chk.glob("chk-*/_metadata"))) >= 2:
                request_stop(jobs[0], drain=drain)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=stop, daemon=True)
    thread.start()
    return thread


def seen(path: Path) -> collections.Counter[Any]:
    lines = path.read_text().splitlines() if path.exists() else []
    return collections.Counter(ast.literal_eval(line) for line in lines)


def run_stopped(tmp_path: Path, drain: bool) -> tuple[Any, Path]:
    chk, witness = tmp_path / "chk", tmp_path / "seen1.txt"
    thread = stop_after_a_checkpoint(chk, drain)
    result = build(None, witness, chk, rate=3_000).run(progress=False)
    thread.join(timeout=10)
    assert result.stopped and result.savepoint, "the job did not stop with a savepoint"
    return result, witness


@pytest.fixture(autouse=True)
def _jobs_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ABSFLOW_JOBS_DIR", str(tmp_path / "jobs"))


def test_a_plain_stop_keeps_windows_open_and_resume_equals_one_run(tmp_path: Path) -> None:
    first, witness = run_stopped(tmp_path, drain=False)
    read = len(first.output("read"))
    assert read < N, f"the stop came after {read} records, past the resumed run's end {N}"
    emitted = collections.Counter(first.output("out"))
    # nothing fired after the final barrier: what left the window step is what committed
    assert seen(witness) == emitted
    second = build(N, tmp_path / "seen2.txt", tmp_path / "chk2").run(
        restore_from=first.savepoint, progress=False
    )
    both = emitted + collections.Counter(second.output("out"))
    assert both == windows_of([event(i) for i in range(N)])
    assert sum(emitted.values()) > 0, "the stop must land after some windows fired"


def test_a_stop_with_drain_fires_every_window_before_the_savepoint(tmp_path: Path) -> None:
    first, witness = run_stopped(tmp_path, drain=True)
    emitted = collections.Counter(first.output("out"))
    read = first.output("read")
    assert read and sorted(read, key=lambda r: r[2]) == [event(i) for i in range(len(read))]
    assert emitted == windows_of(read)  # every record read is in a fired window
    assert seen(witness) == emitted
