"""Loop pipelines shared by the loop tests: Collatz (records circulate until 1) and a
multiplying loop (every pass sends two records back) with a slow sink."""

from __future__ import annotations

import collections
import time
from typing import Any

from runtime import Dataflow
from runtime.sources import GeneratorSource


def _start(i: int) -> tuple[int, int, int]:
    return (i + 1, i + 1, 0)


def _collatz(r: tuple[int, int, int]) -> tuple[int, int, int]:
    n, v, k = r
    return r if v == 1 else (n, v // 2 if v % 2 == 0 else 3 * v + 1, k + 1)


def _steps(n: int) -> int:
    k = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        k += 1
    return k


def collatz(n: int, rate: float | None = None, **config: Any) -> Dataflow:
    """Collatz at parallelism 2 unless ``config`` says another."""
    flow = Dataflow("collatz", **{"parallelism": 2, **config})
    loop = flow.source(GeneratorSource(_start, n, rate=rate), name="numbers").iterate(name="loop")
    step = loop.stream.map(_collatz, name="step")
    loop.feedback(step.filter(lambda r: r[1] != 1, name="again").key_by(lambda r: r[0]))
    step.filter(lambda r: r[1] == 1, name="done").map(lambda r: (r[0], r[2]), name="count").collect(
        "steps"
    )
    return flow


def collatz_expected(n: int) -> collections.Counter[tuple[int, int]]:
    return collections.Counter((k, _steps(k)) for k in range(1, n + 1))


DEPTH = 6


def _fan_out(r: tuple[str, int, int]) -> list[tuple[str, int, int]]:
    _tag, n, depth = r
    out = [("out", n, depth)]
    if depth < DEPTH:
        out += [("loop", 2 * n, depth + 1), ("loop", 2 * n + 1, depth + 1)]
    return out


def _slowly(r: Any) -> Any:
    time.sleep(0.0002)
    return (r[1], r[2])


def multiplying(n: int, **config: Any) -> Dataflow:
    """Each record sends two back until depth DEPTH: n * (2**(DEPTH+1) - 1) outputs, through
    a slow sink, with tiny channel buffers: the loop must keep draining its feedback."""
    flow = Dataflow("multiplying", parallelism=2, **config)
    loop = flow.source(GeneratorSource(lambda i: ("loop", i, 0), n), name="seeds").iterate(
        name="loop"
    )
    body = loop.stream.rebalance().flat_map(_fan_out, name="fan_out")
    loop.feedback(body.filter(lambda r: r[0] == "loop", name="again").rebalance())
    body.filter(lambda r: r[0] == "out", name="leave").map(_slowly, name="slow").collect("out")
    return flow


def multiplying_expected(n: int) -> collections.Counter[tuple[int, int]]:
    out: collections.Counter[tuple[int, int]] = collections.Counter()
    level = list(range(n))
    for depth in range(DEPTH + 1):
        out.update((k, depth) for k in level)
        level = [c for k in level for c in (2 * k, 2 * k + 1)]
    return out
