"""Timers in keyed state: order, delete, exactly once across snapshot/restore, rescaling."""

from __future__ import annotations

from typing import Any

from channels.partitioners import key_group_for, key_group_range
from statebackend.keyed import KeyedStateBackend
from statebackend.timers import NamespacedState, TimerService

MAX_P = 16


def backend(subtask: int = 0, parallelism: int = 1) -> KeyedStateBackend:
    return KeyedStateBackend(
        "op",
        MAX_P,
        key_group_range(subtask, parallelism, MAX_P),
        lambda k: key_group_for(k, MAX_P),
    )


def fired(service: TimerService, until: float) -> list[tuple[Any, float]]:
    return [(k, ts) for k, ts, _ns in service.event.due(until)]


def test_timers_fire_in_time_order_once_and_can_be_deleted() -> None:
    timers = TimerService(backend())
    for key, ts in [("a", 30), ("b", 10), ("a", 20), ("c", 40), ("a", 20)]:
        timers.event.register(key, ts, None)
    timers.event.delete("c", 40, None)
    assert fired(timers, 25) == [("b", 10), ("a", 20)]
    assert fired(timers, 25) == []
    assert timers.event.next_time() == 30
    assert fired(timers, 100) == [("a", 30)]
    assert len(timers.event) == 0


def test_a_timer_registered_while_firing_fires_in_the_same_pass_if_due() -> None:
    timers = TimerService(backend())
    timers.event.register("k", 5, None)
    out = []
    for key, ts, _ns in timers.event.due(10):
        out.append(ts)
        if ts == 5:
            timers.event.register(key, 8, None)
    assert out == [5, 8]


def test_timers_fire_exactly_once_across_a_restore() -> None:
    live = backend()
    timers = TimerService(live)
    timers.event.register("fired-before", 10, None)
    timers.event.register("pending", 50, None)
    assert fired(timers, 20) == [("fired-before", 10)]
    blob = live.snapshot()  # the checkpoint, taken between batches
    timers.event.register("after-checkpoint", 30, None)  # lost with the failure, replayed later

    restored_backend = backend()
    restored_backend.restore([blob])
    restored = TimerService(restored_backend)
    restored.rebuild()
    assert fired(restored, 100) == [("pending", 50)]
    assert fired(restored, 200) == []


def test_timers_rescale_with_their_key_groups() -> None:
    one = backend()
    timers = TimerService(one)
    keys = [f"user{i}" for i in range(40)]
    for i, key in enumerate(keys):
        timers.event.register(key, 1000 + i, None)
        timers.processing.register(key, 5000 + i, None)
    blob = one.snapshot()
    seen: list[Any] = []
    for subtask in range(3):  # rescale 1 -> 3: each gets the keys of its key groups
        part = backend(subtask, 3)
        part.restore([blob])
        service = TimerService(part)
        service.rebuild()
        owned = key_group_range(subtask, 3, MAX_P)
        got = fired(service, 10_000)
        assert all(key_group_for(k, MAX_P) in owned for k, _ in got)
        assert [ts for _, ts in got] == sorted(ts for _, ts in got)
        assert len(list(service.processing.due(10_000))) == len(got)
        seen += [k for k, _ in got]
    assert sorted(seen) == sorted(keys)


def test_namespaced_state_per_key_and_window() -> None:
    b = backend()
    state = NamespacedState(b, "acc")
    state.put("k", (0, 10), 3)
    state.put("k", (10, 20), 4)
    assert state.get("k", (0, 10)) == 3 and len(state) == 2
    assert state.pop("k", (0, 10)) == 3
    restored = backend()
    restored.restore([b.snapshot()])
    assert NamespacedState(restored, "acc").namespaces("k") == {(10, 20): 4}


def test_clear_drops_every_timer() -> None:
    timers = TimerService(backend())
    timers.event.register("k", 1, None)
    timers.clear()
    assert fired(timers, 10) == [] and len(timers.event) == 0
