"""The ABS paper's benchmark topology (Carbone et al. 2015, section 6).

Six operators, three hash shuffles, keyed aggregation state and source offsets;
chaining is off, so parallelism p gives 6p tasks:

    source (offsets) -> parse -> key_by -> count (keyed) -> key_by -> regroup (keyed)
                     -> key_by -> total (keyed) -> sink (a checkpointed count)

Record i is ``(i % KEYS, i)``; the source is deterministic and spread over its
subtasks (subtask s takes i = s, s + p, ...). ``hot_share`` k: every k-th record has
key 0 instead (a skewed key); ``slow_key``: the ``regroup`` subtask that owns that key
sleeps ``slow_seconds`` per record of it (a backpressured keyed task: the scenario
where aligning on it costs the most). Checked by
``check(result, n)``: the sink saw every record once and the final totals add up.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from keyed_count import CountingSink

from runtime import Dataflow
from runtime.sources import GeneratorSource

KEYS = 1_000
TASKS_PER_P = 6


def record(i: int) -> tuple[int, int]:
    return (i % KEYS, i)


def parse(r: tuple[int, int]) -> tuple[int, int]:
    return (r[0], r[1] & 0xFF)


def count(n: int, _r: tuple[int, int]) -> int:
    return n + 1


def first(t: tuple[Any, ...]) -> Any:
    return t[0]


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

    def skewed(i: int) -> tuple[int, int]:
        return (0, i) if hot_share and i % hot_share == 0 else record(i)

    def regroup(key: int, value: tuple[int, int], state: Any) -> list[tuple[int, int]]:
        if key == slow_key:
            time.sleep(slow_seconds)
        state.value = (state.value or 0) + 1
        return [(key % 100, state.value)]

    (
        flow.source(GeneratorSource(skewed, n, rate=rate), name="source")
        .map(parse, name="parse")
        .key_by(first)
        .aggregate(0, count, name="count")
        .key_by(first)
        .process(regroup, name="regroup")
        .key_by(first)
        .aggregate(0, count, name="total")
        .sink(CountingSink(), name="sink")
    )
    return flow


def check(result: Any, n: int) -> bool:
    """Every record reached the sink once; the last totals per key add up to n."""
    summaries = result.output("sink")
    seen = sum(int(s["n"]) for s in summaries)
    return seen == n and sum(int(s["sum_last"]) for s in summaries) == n
