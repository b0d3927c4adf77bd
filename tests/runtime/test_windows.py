"""Window kinds against a direct computation, without Spark: out-of-order records,
late within the allowed lateness (update and re-emit), too late (late output), session
merging, state freed once the watermark passes end + lateness, and build-time errors."""

from __future__ import annotations

import collections
import random
from typing import Any

import pytest

from runtime.api.dataflow import Dataflow, Loop, Stream
from runtime.errors import GraphError
from runtime.graph import StepKind
from runtime.operators import Operator, build_operator
from runtime.sources import CollectionSource
from runtime.window_kinds import Session, Sliding, Tumbling, TumblingProcessingTime, WindowKind
from runtime.windows import LATE, MAIN
from tests.runtime.backends import state_backend  # noqa: F401  (a fixture)

pytestmark = pytest.mark.usefixtures("state_backend")


def ts_of(r: Any) -> Any:
    return r[1]


def key_of(r: Any) -> Any:
    return r[0]


def window_op(
    kind: WindowKind, finish: str = "count", lateness: float = 0, late: str | None = None
) -> Operator:
    flow = Dataflow("w")
    w = (
        flow.source(CollectionSource([]), name="src")
        .assign_timestamps(ts_of, name="ts")
        .key_by(key_of)
        .window(kind, name="win", allowed_lateness=lateness, late_output=late)
    )
    out: Stream[Any]  # one of three finishes, each with its own record type
    if finish == "count":
        out = w.count()
    elif finish == "sum":
        out = w.aggregate(0, lambda a, r: a + r[2], merge=lambda a, b: a + b)
    else:
        out = w.process(lambda k, s, e, rs: sorted(r[2] for r in rs))
    out.collect("out")
    if late:
        w.late.collect("late")
    plan = flow.plan()
    step = next(s for s in plan.steps if s.kind is StepKind.WINDOW)
    return build_operator(step, 0, 128)


Script = list[tuple[str, Any]]  # ("r", record) or ("w", watermark)


def run(op: Operator, script: Script) -> list[Any]:
    out: list[Any] = []
    for what, item in script:
        out += op.process([item]) if what == "r" else op.on_watermark(item)
    out += op.on_watermark(float("inf"))
    return out


def direct(kind: WindowKind, lateness: float, script: Script) -> tuple[list[Any], list[Any]]:
    """The same semantics, computed directly: every accepted record of a window kept,
    the count computed from scratch at each emission."""
    wm = float("-inf")
    windows: dict[tuple[Any, float, float], list[Any]] = collections.defaultdict(list)
    fired: set[tuple[Any, float, float]] = set()
    out: list[Any] = []
    late: list[Any] = []
    for what, item in [*script, ("w", float("inf"))]:
        if what == "w":
            wm = max(wm, item)
            for w in sorted(windows, key=lambda w: (w[2], str(w[0]))):
                if w not in fired and w[2] <= wm:
                    fired.add(w)
                    out.append((*w, len(windows[w])))
            continue
        accepted = False
        for start, end in kind.windows(item[1]):
            if end + lateness <= wm:
                continue
            accepted = True
            w = (item[0], start, end)
            windows[w].append(item)
            if w in fired:
                out.append((*w, len(windows[w])))
        if not accepted:
            late.append(item)
    return out, late


def by_window(results: list[Any]) -> dict[Any, list[Any]]:
    out: dict[Any, list[Any]] = collections.defaultdict(list)
    for key, start, end, value in results:
        out[(key, start, end)].append(value)
    return dict(out)


def random_script(seed: int, n: int = 400, keys: int = 3) -> Script:
    """Event times rising with jitter (out of order), watermarks trailing by 15 every few
    records, and a few records far in the past (late or too late)."""
    rng = random.Random(seed)
    script: Script = []
    top = 0
    for i in range(n):
        t = i * 3 + rng.randrange(-20, 20)
        if rng.random() < 0.05:
            t -= rng.randrange(20, 120)  # late: within lateness or beyond it
        script.append(("r", (f"k{rng.randrange(keys)}", max(0, t), 1)))
        top = max(top, t)
        if i % 7 == 0:
            script.append(("w", top - 15))
    return script


@pytest.mark.parametrize("kind", [Tumbling(50), Sliding(60, 20), Tumbling(40, offset=5)])
@pytest.mark.parametrize("lateness", [0, 30])
@pytest.mark.parametrize("seed", [1, 2])
def test_fixed_windows_equal_a_direct_computation(
    kind: WindowKind, lateness: float, seed: int
) -> None:
    script = random_script(seed)
    want, want_late = direct(kind, lateness, script)
    got = run(window_op(kind, lateness=lateness, late="late"), script)
    # per window, its emissions in order (windows firing at one watermark: any order)
    assert by_window([r[1] for r in got if r[0] == MAIN]) == by_window(want)
    assert [r[1] for r in got if r[0] == LATE] == want_late
    assert want_late  # the script has too-late records
    if lateness:  # and records late within the lateness, which re-emit their window
        assert any(len(v) > 1 for v in by_window(want).values())
    assert any(r for r in want if r[-1] > 1)


def test_tumbling_late_within_lateness_re_emits_and_too_late_goes_to_late_output() -> None:
    op = window_op(Tumbling(10), lateness=5, late="late")
    script: Script = [
        ("r", ("a", 3, 1)),
        ("r", ("a", 12, 1)),
        ("r", ("a", 1, 1)),  # out of order, same window
        ("w", 10),  # [0, 10) fires with 2
        ("r", ("a", 7, 1)),  # late within lateness: re-emitted with 3
        ("w", 15),  # [0, 10) cleaned up; [10, 20) not yet
        ("r", ("a", 9, 1)),  # too late
        ("r", ("a", 19, 1)),
    ]
    got = run(op, script)
    assert got == [
        (MAIN, ("a", 0, 10, 2)),
        (MAIN, ("a", 0, 10, 3)),
        (LATE, ("a", 9, 1)),
        (MAIN, ("a", 10, 20, 2)),
    ]


def test_window_state_is_freed_when_the_watermark_passes_end_plus_lateness() -> None:
    op = window_op(Tumbling(10), lateness=5)
    op.process([("a", t, 1) for t in range(0, 100)])
    state = op.state  # type: ignore[attr-defined]
    assert len(state) == 10
    op.on_watermark(54)  # windows ending <= 49 are cleaned up: [0,10)..[30,40)
    assert len(state) == 6
    op.on_watermark(float("inf"))
    assert len(state) == 0 and len(op.timers.event) == 0  # type: ignore[attr-defined]


def sessions_direct(gap: float, records: list[Any]) -> list[Any]:
    by_key: dict[Any, list[float]] = collections.defaultdict(list)
    for k, t, _ in records:
        by_key[k].append(t)
    out = []
    for k, ts in by_key.items():
        ts.sort()
        start, last, n = ts[0], ts[0], 0
        for t in ts:
            if t >= last + gap:
                out.append((k, start, last + gap, n))
                start, n = t, 0
            last, n = t, n + 1
        out.append((k, start, last + gap, n))
    return sorted(out)


def test_sessions_merge_and_equal_a_direct_sessionization() -> None:
    rng = random.Random(5)
    records = [(f"u{rng.randrange(4)}", rng.randrange(0, 2_000), 1) for _ in range(600)]
    # out of order within 100; watermark trails the max by 100 so no record is late
    records.sort(key=lambda r: r[1] + rng.randrange(0, 100))
    script: Script = []
    top = 0
    for i, r in enumerate(records):
        script.append(("r", r))
        top = max(top, r[1])
        if i % 10 == 0:
            script.append(("w", top - 110))
    got = run(window_op(Session(gap=25)), script)
    assert sorted(got) == sessions_direct(25, records)


def test_a_record_bridging_two_sessions_merges_them() -> None:
    op = window_op(Session(gap=10), finish="sum")
    out = op.process([("a", 0, 1), ("a", 30, 2), ("a", 15, 4)])
    assert out == []
    assert sorted(op.state.namespaces("a")) == [(0, 10), (15, 25), (30, 40)]  # type: ignore[attr-defined]
    op.process([("a", 8, 8), ("a", 22, 16)])  # bridges all three
    assert op.state.namespaces("a") == {(0, 40): 31}  # type: ignore[attr-defined]
    assert op.on_watermark(39) == []
    assert op.on_watermark(40) == [("a", 0, 40, 31)]


def test_records_exactly_gap_apart_open_two_sessions() -> None:
    op = window_op(Session(gap=10))
    assert run(op, [("r", ("a", 0, 1)), ("r", ("a", 10, 1)), ("w", float("inf"))]) == [
        ("a", 0, 10, 1),
        ("a", 10, 20, 1),
    ]


@pytest.mark.parametrize("lateness", [0, 5])
def test_a_session_record_older_than_watermark_minus_lateness_is_too_late(
    lateness: float,
) -> None:
    """Session [0, 10) fires and is freed at watermark 10 + L. A record at 4 + L would
    have extended it to [0, 14 + L); its own [ts, ts + gap) reaches past the horizon, but
    the session it belongs to is gone: accepting it would emit a wrong session [4 + L,
    14 + L) beside [0, 10). It goes to the late output instead."""
    op = window_op(Session(gap=10), lateness=lateness, late="late")
    script: Script = [("r", ("a", 0, 1)), ("w", 10 + lateness), ("r", ("a", 4 + lateness, 2))]
    got = run(op, script) + op.on_watermark(float("inf"))
    assert got == [(MAIN, ("a", 0, 10, 1)), (LATE, ("a", 4 + lateness, 2))]
    # the same record before the clean-up: late within lateness, it extends the session
    if lateness:
        op = window_op(Session(gap=10), lateness=lateness, late="late")
        got = run(op, [("r", ("a", 0, 1)), ("w", 10), ("r", ("a", 10 - lateness + 1, 2))])
        assert got == [(MAIN, ("a", 0, 10, 1)), (MAIN, ("a", 0, 16, 2))]


def test_full_window_process_sees_every_record() -> None:
    op = window_op(Tumbling(10), finish="process")
    assert run(op, [("r", ("a", 5, 3)), ("r", ("a", 1, 2)), ("r", ("b", 2, 9))]) == [
        ("a", 0, 10, [2, 3]),
        ("b", 0, 10, [9]),
    ]


def test_processing_time_tumbling_windows_fire_by_the_clock() -> None:
    op = window_op(TumblingProcessingTime(1.0))
    now = [100.2]
    op.clock = lambda: now[0]  # type: ignore[attr-defined]
    op.process([("a", 0, 1), ("a", 0, 1)])
    now[0] = 100.7
    op.process([("b", 0, 1)])
    assert op.on_processing_time(100.9) == []
    fired: list[Any] = op.on_processing_time(101.0)  # (key, start, end, count)
    assert sorted(fired) == [("a", 100.0, 101.0, 2), ("b", 100.0, 101.0, 1)]


def test_build_time_errors_name_the_step() -> None:
    flow = Dataflow("bad")
    keyed = flow.source(CollectionSource([("a", 1, 1)]), name="src").key_by(key_of)
    with pytest.raises(GraphError, match=r"step 'w0': window size must be a number > 0, got 0"):
        keyed.window(Tumbling(0), name="w0")
    for gap in (0, -1, float("inf"), float("nan")):
        with pytest.raises(GraphError, match=r"step 'g': window gap must be a number > 0"):
            keyed.window(Session(gap), name="g")
    with pytest.raises(GraphError, match=r"step 'w1': sliding window slide 20 is larger"):
        keyed.window(Sliding(10, 20), name="w1")
    with pytest.raises(GraphError, match=r"step 'w2': session windows merge.*merge="):
        keyed.window(Session(5), name="w2").aggregate(0, lambda a, r: a + 1)
    with pytest.raises(GraphError, match=r"step 'w3': allowed_lateness"):
        keyed.window(Tumbling(5), name="w3", allowed_lateness=-1)
    keyed.window(Tumbling(5), name="w4").count().collect("out")
    with pytest.raises(
        GraphError, match=r"step 'w4' uses event time, but its input has no timestamps"
    ):
        flow.plan()


def test_windows_after_a_map_need_a_timestamp_and_refuse_loops() -> None:
    flow = Dataflow("bad")
    src = flow.source(CollectionSource([("a", 1, 1)]), name="src").assign_timestamps(ts_of)
    src.map(lambda r: r, name="m").key_by(key_of).window(Tumbling(5), name="wm").count().collect(
        "out"
    )
    with pytest.raises(GraphError, match=r"step 'wm'.*reshaped.*pass timestamp=fn"):
        flow.plan()

    flow = Dataflow("loop")
    src = flow.source(CollectionSource([("a", 1, 1)]), name="src").assign_timestamps(ts_of)
    loop: Loop[Any] = src.iterate(name="loop")  # fed back: window counts, not its records
    body = loop.stream.key_by(key_of).window(Tumbling(5), name="wl").count()
    loop.feedback(body.filter(lambda r: False))
    body.collect("out")
    with pytest.raises(GraphError, match=r"step 'wl' uses event time inside loop 'loop'"):
        flow.plan()


def test_a_record_later_than_every_watermark_is_processed_not_lost() -> None:
    """Clock skew: a timestamp far ahead of the watermark lands in its window, which fires
    when the watermark gets there (here: at the end of input)."""
    op = window_op(Tumbling(10))
    assert op.process([("a", 5, 1), ("a", 10**12, 1)]) == []
    assert op.on_watermark(100) == [("a", 0, 10, 1)]
    assert op.on_watermark(float("inf")) == [("a", 10**12, 10**12 + 10, 1)]


@pytest.mark.parametrize("kind", [Tumbling(10), Session(gap=10)])
def test_a_late_update_of_a_fired_window_is_emitted_once(kind: WindowKind) -> None:
    op = window_op(kind, lateness=100)
    op.process([("a", 1, 1)])
    assert op.on_watermark(50) == [("a", 1 if kind.merging else 0, 11 if kind.merging else 10, 1)]
    late: list[Any] = op.process(
        [("a", 2, 1), ("b", 3, 1)]
    )  # a: fired window; b: a window never seen
    assert len(late) == 2 and {r[0] for r in late} == {"a", "b"}
    assert op.on_watermark(60) == []  # no second emission from a timer in the past
    assert op.on_watermark(float("inf")) == []
