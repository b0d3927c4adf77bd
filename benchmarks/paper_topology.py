"""The ABS paper's benchmark topology (Carbone et al. 2015, section 6).

Six operators, three hash shuffles, keyed aggregation state and source offsets;
chaining is off, so parallelism p gives 6p tasks:

    source (offsets) -> parse -> key_by -> count (keyed) -> key_by -> regroup (keyed)
                     -> key_by -> total (keyed) -> sink (a checkpointed count)

Record i is ``(i % KEYS, i, t)`` with ``t`` the wall-clock time the source emitted it
(with a ``rate``: the time its schedule says it should have been emitted);
every step carries the ``t`` of the record that caused its output, so the sink measures
each record's end-to-end latency (a histogram in 1 ms buckets, checkpointed with the
sink). The source is deterministic and spread over its subtasks (subtask s takes i = s, s
+ p, ...). ``hot_share`` k: every k-th record has key 0 instead (a skewed key);
``slow_key``: the ``regroup`` subtask that owns that key sleeps ``slow_seconds`` per
record of it (a backpressured keyed task: the scenario where aligning on it costs the
most). Checked by ``check(result, n)``: the sink saw every record once and the final
totals add up; ``latency(result)`` gives the latency percentiles.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runtime import Dataflow
from runtime.sinks import Sink
from runtime.sources import GeneratorSource

KEYS = 1_000
TASKS_PER_P = 6
Record = tuple[int, int, float]


def record(i: int) -> Record:
    return (i % KEYS, i, time.time())


def parse(r: Record) -> Record:
    return (r[0], r[1] & 0xFF, r[2])


def count(acc: tuple[int, float], r: Any) -> tuple[int, float]:
    """A running count that remembers the emit time of the record it counted last:
    ``r`` is a parsed record or a ``(key, (count, t))`` from upstream."""
    t = r[2] if len(r) == 3 else r[1][1]
    return (acc[0] + 1, t)


def first(t: tuple[Any, ...]) -> Any:
    return t[0]


class LatencySink(Sink):
    """Counts records, keeps the last count per key and a histogram of end-to-end
    latencies (ms buckets); all checkpointed, and the summary reaches the driver with the
    final checkpoint (exactly once)."""

    def open(self, ctx: Any) -> None:
        super().open(ctx)
        self.n = 0
        self.last: dict[Any, int] = {}
        self.hist: dict[int, int] = {}

    def write_batch(self, records: list[Any]) -> None:
        self.n += len(records)
        last, hist = self.last, self.hist
        now = time.time()
        for k, (c, t) in records:
            last[k] = c
            ms = int((now - t) * 1000)
            hist[ms] = hist.get(ms, 0) + 1

    def snapshot_state(self, checkpoint_id: int) -> Any:
        return {"n": self.n, "last": self.last, "hist": self.hist}

    def restore_state(self, state: Any) -> None:
        if state:
            self.n, self.last = state["n"], dict(state["last"])
            self.hist = {int(k): v for k, v in state["hist"].items()}

    def finish(self) -> None:
        self.summary: dict[str, Any] | None = {
            "n": self.n,
            "keys": len(self.last),
            "sum_last": sum(self.last.values()),
            "hist": self.hist,
        }

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        summary = getattr(self, "summary", None)
        if summary is not None:
            self.ctx.send_to_driver(checkpoint_id, [summary])
            self.summary = None


def build(
    n: int,
    parallelism: int,
    slow_key: int | None = None,
    slow_seconds: float = 0.0,
    rate: float | None = None,
    hot_share: int | None = None,
    **config: Any,
) -> Dataflow:
    flow = Dataflow("abs-eval", parallelism=parallelism, chaining=False, **config)

    origin: list[float] = []  # per task process (the closure is copied into each)

    def stamp(i: int) -> float:
        """When record ``i`` should be emitted: now at full speed; with a ``rate``, its
        place in the schedule (``i / rate`` after the first record this subtask emitted),
        so a source held back (a synchronous halt, backpressure) adds the time its records
        waited to their latency instead of hiding it (coordinated omission)."""
        if rate is None:
            return time.time()
        if not origin:
            origin.append(time.time() - i / rate)
        return origin[0] + i / rate

    def skewed(i: int) -> Record:
        key = 0 if hot_share and i % hot_share == 0 else i % KEYS
        return (key, i, stamp(i))

    def regroup(key: int, value: tuple[int, tuple[int, float]], state: Any) -> list[Any]:
        if key == slow_key:
            time.sleep(slow_seconds)
        state.value = (state.value or 0) + 1
        return [(key % 100, (state.value, value[1][1]))]

    (
        flow.source(GeneratorSource(skewed, n, rate=rate), name="source")
        .map(parse, name="parse")
        .key_by(first)
        .aggregate((0, 0.0), count, name="count")
        .key_by(first)
        .process(regroup, name="regroup")
        .key_by(first)
        .aggregate((0, 0.0), count, name="total")
        .sink(LatencySink(), name="sink")
    )
    return flow


def check(result: Any, n: int) -> bool:
    """Every record reached the sink once; the last totals per key add up to n."""
    summaries = result.output("sink")
    seen = sum(int(s["n"]) for s in summaries)
    return seen == n and sum(int(s["sum_last"]) for s in summaries) == n


def latency_hist(result: Any) -> dict[int, int]:
    """The sinks' end-to-end latency histogram (ms bucket -> records), merged."""
    merged: dict[int, int] = {}
    for s in result.output("sink"):
        for ms, k in s["hist"].items():
            merged[int(ms)] = merged.get(int(ms), 0) + int(k)
    return merged


def percentile(hist: dict[int, int], q: float) -> float:
    """The ``q`` quantile (0..1) of a ms histogram, in ms (its bucket's upper edge)."""
    total = sum(hist.values())
    if not total:
        return float("nan")
    rank, seen = q * total, 0
    for ms in sorted(hist):
        seen += hist[ms]
        if seen >= rank:
            return float(ms + 1)
    return float(max(hist) + 1)
