"""Joins without Spark: the interval join against a direct computation (out-of-order
input, both sides interleaved), state freed by the watermark, the window join, the
co-process step's sides and shared state, and build-time errors."""

from __future__ import annotations

import random
from typing import Any

import pytest

from runtime.api.dataflow import Dataflow, KeyedStream, Stream
from runtime.errors import GraphError
from runtime.graph import StepKind
from runtime.operators import Operator, build_operator
from runtime.sources import CollectionSource
from runtime.window_kinds import Session, Tumbling
from tests.runtime.backends import state_backend  # noqa: F401  (a fixture)

pytestmark = pytest.mark.usefixtures("state_backend")


def ts_of(r: Any) -> Any:
    return r[1]


def key_of(r: Any) -> Any:
    return r[0]


def sides(flow: Dataflow) -> tuple[KeyedStream, KeyedStream]:
    left = flow.source(CollectionSource([]), name="l").assign_timestamps(ts_of, name="lt")
    right = flow.source(CollectionSource([]), name="r").assign_timestamps(ts_of, name="rt")
    return left.key_by(key_of), right.key_by(key_of)


def join_op(kind: str, **kw: Any) -> Operator:
    flow = Dataflow("j")
    left, right = sides(flow)
    connected = left.connect(right)
    out: Stream[Any]  # each join kind has its own record type
    if kind == "interval":
        out = connected.interval_join(kw["lower"], kw["upper"], name="join")
    elif kind == "window":
        out = connected.window_join(Tumbling(kw["size"]), name="join")
    else:
        out = connected.process(kw["fn"], name="join", on_timer=kw.get("on_timer"))
    out.collect("out")
    step = next(s for s in flow.plan().steps if s.name == "join")
    return build_operator(step, 0, 128)


def random_events(seed: int, n: int = 300) -> list[tuple[str, Any]]:
    """("L"/"R", (key, ts, id)) out of order by < 30; watermarks ("W", wm) trail by 30."""
    rng = random.Random(seed)
    out: list[tuple[str, Any]] = []
    top = 0
    for i in range(n):
        ts = i * 2 + rng.randrange(0, 30)
        top = max(top, ts)
        out.append((rng.choice("LR"), (f"k{rng.randrange(4)}", ts, i)))
        if i % 5 == 0:
            out.append(("W", top - 30))
    return out


def drive(op: Operator, events: list[tuple[str, Any]]) -> list[Any]:
    got: list[Any] = []
    for what, item in events:
        if what == "W":
            got += op.on_watermark(item)
        else:
            got += op.process([item], 0 if what == "L" else 1)
    return got + op.on_watermark(float("inf"))


@pytest.mark.parametrize(("lower", "upper"), [(0, 10), (-5, 5), (3, 20)])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_interval_join_equals_a_direct_computation(lower: int, upper: int, seed: int) -> None:
    events = random_events(seed)
    lefts = [r for w, r in events if w == "L"]
    rights = [r for w, r in events if w == "R"]
    want = sorted(
        (a[0], a, b)
        for a in lefts
        for b in rights
        if a[0] == b[0] and a[1] + lower <= b[1] <= a[1] + upper
    )
    op = join_op("interval", lower=lower, upper=upper)
    got = drive(op, events)
    assert sorted(got) == want and len(got) == len(set(got))
    assert want
    assert len(op.buffers[0]) + len(op.buffers[1]) == 0  # type: ignore[attr-defined]


def test_interval_join_state_is_freed_as_the_watermark_passes() -> None:
    op = join_op("interval", lower=0, upper=10)
    op.process([("a", t, t) for t in range(0, 1000, 5)], 0)
    left = op.buffers[0]  # type: ignore[attr-defined]
    assert len(left) == 200
    op.on_watermark(500)  # lefts with ts + 10 < 500 can meet no right any more
    assert len(left) == 200 - 98
    op.on_watermark(float("inf"))
    assert len(left) == 0 and len(op.timers.event) == 0  # type: ignore[attr-defined]


def test_window_join_pairs_records_of_the_same_window() -> None:
    events = random_events(4)
    want = sorted(
        (a[0], a[1] - a[1] % 20, a[1] - a[1] % 20 + 20, a, b)
        for w1, a in events
        if w1 == "L"
        for w2, b in events
        if w2 == "R" and a[0] == b[0] and a[1] // 20 == b[1] // 20
    )
    op = join_op("window", size=20)
    assert sorted(drive(op, events)) == want
    assert len(op.windows) == 0  # type: ignore[attr-defined]


def test_co_process_sees_sides_and_shares_state_and_timers() -> None:
    def fn(key: Any, record: Any, side: int, state: Any, ctx: Any) -> list[Any]:
        state.list("seen").append(side)
        ctx.register_event_time_timer(100)
        return [(key, side, ctx.timestamp)]

    def on_timer(key: Any, ts: float, state: Any, ctx: Any) -> list[Any]:
        return [(key, "timer", list(state.list("seen")))]

    op = join_op("process", fn=fn, on_timer=on_timer)
    assert op.process([("a", 1, 0)], 0) == [("a", 0, 1)]
    assert op.process([("a", 7, 0)], 1) == [("a", 1, 7)]
    assert op.on_watermark(100) == [("a", "timer", [0, 1])]


def test_join_build_time_errors_name_the_step() -> None:
    flow = Dataflow("bad")
    left, right = sides(flow)
    with pytest.raises(GraphError, match="a join of unkeyed streams"):
        left.connect(flow.source(CollectionSource([]), name="x"))  # type: ignore[arg-type]
    with pytest.raises(GraphError, match="both sides come from step"):
        left.connect(left)
    with pytest.raises(GraphError, match=r"step 'j1': lower bound 5 is above upper bound 1"):
        left.connect(right).interval_join(5, 1, name="j1")
    with pytest.raises(GraphError, match=r"step 'j2': window_join needs a Tumbling or Sliding"):
        left.connect(right).window_join(Session(5), name="j2")

    flow = Dataflow("no_ts")
    a = flow.source(CollectionSource([]), name="a").key_by(key_of)
    b = flow.source(CollectionSource([]), name="b").assign_timestamps(ts_of).key_by(key_of)
    a.connect(b).interval_join(0, 1, name="j3").collect("out")
    with pytest.raises(GraphError, match=r"step 'j3'.*left input 'a' has no timestamps"):
        flow.plan()
    assert StepKind.INTERVAL_JOIN.keyed
