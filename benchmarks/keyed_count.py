"""The keyed running count that our peers were measured on (shared by the benchmarks).

N records, record i = f"w{(i*7919) % 10000}" (10,000 keys), key_by the word, a
running count per key in keyed state, one (word, count) per input record, and a
sink that counts records and keeps the last count per key. The check:
sum(last counts) == N.
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runtime import Dataflow
from runtime.sinks import Sink
from runtime.sources import GeneratorSource

VOCAB = 10_000


def word(i: int) -> str:
    return f"w{(i * 7919) % VOCAB}"


class CountingSink(Sink):
    """Counts records and keeps the last count per key; both are checkpointed, and the
    summary reaches the driver with the final checkpoint (exactly once)."""

    def open(self, ctx: Any) -> None:
        super().open(ctx)
        self.n = 0
        self.last: dict[Any, int] = {}

    def write_batch(self, records: list[Any]) -> None:
        self.n += len(records)
        last = self.last
        for k, c in records:
            last[k] = c

    def snapshot_state(self, checkpoint_id: int) -> Any:
        return {"n": self.n, "last": self.last}

    def restore_state(self, state: Any) -> None:
        if state:
            self.n, self.last = state["n"], dict(state["last"])

    def finish(self) -> None:
        self.summary: dict[str, int] | None = {
            "n": self.n,
            "keys": len(self.last),
            "sum_last": sum(self.last.values()),
        }

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        summary = getattr(self, "summary", None)
        if summary is not None:
            self.ctx.send_to_driver(checkpoint_id, [summary])
            self.summary = None


def build(n: int, parallelism: int, **config: Any) -> Dataflow:
    flow = Dataflow("keyed_count", parallelism=parallelism, **config)
    (
        flow.source(GeneratorSource(word, n), name="words")
        .key_by(lambda w: w)
        .aggregate(0, lambda c, _w: c + 1, name="count")
        .sink(CountingSink(), name="sink")
    )
    return flow


def check(result: Any, n: int) -> dict[str, Any]:
    """Sink summaries of a run: records seen, keys, and whether sum(last counts) == n."""
    summaries = result.outputs.get("sink") or []
    got = {
        "n": sum(s["n"] for s in summaries),
        "keys": sum(s["keys"] for s in summaries),
        "sum_last": sum(s["sum_last"] for s in summaries),
    }
    got["correct"] = got["sum_last"] == n and got["n"] == n
    return got
