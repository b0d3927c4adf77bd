"""Four-counter termination detection driven by scripted answers."""

from __future__ import annotations

from jobmanager.termination import LoopTermination, Wave
from runtime import control as P


class Probes:
    def __init__(self) -> None:
        self.sent: list[tuple[int, P.Message]] = []

    def __call__(self, index: int, message: P.Message) -> None:
        self.sent.append((index, message))

    def rounds(self) -> list[int]:
        return sorted({m.round for _i, m in self.sent if isinstance(m, P.LoopProbe)})


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def answer(t: LoopTermination, counts: dict[int, tuple[int, int]]) -> bool:
    for index, (sent, received) in counts.items():
        t.on_status(P.LoopStatus(index, 0, t.round, sent, received))
    return t.on_tick()


def detector() -> tuple[LoopTermination, Probes, Clock]:
    probes, clock = Probes(), Clock()
    return LoopTermination([0, 1, 2], probes, interval=0.0, clock=clock), probes, clock


def started(t: LoopTermination) -> LoopTermination:
    t.start()
    t.on_tick()
    return t


def test_nothing_happens_before_the_sources_ended() -> None:
    t, probes, _ = detector()
    assert t.on_tick() is False and probes.sent == []


def test_two_equal_balanced_waves_prove_termination() -> None:
    t, probes, _ = detector()
    t.start()
    assert probes.sent == []  # the first wave goes out at the next tick
    assert t.on_tick() is False
    assert [i for i, _m in probes.sent] == [0, 1, 2]
    assert answer(t, {0: (10, 0), 1: (5, 10), 2: (0, 5)}) is False  # balanced, first wave
    assert answer(t, {0: (10, 0), 1: (5, 10), 2: (0, 5)}) is True
    assert t.terminated and t.waves == [Wave(1, 15, 15), Wave(2, 15, 15)]
    assert probes.rounds() == [1, 2]


def test_records_in_flight_keep_the_job_running() -> None:
    t, _, _ = detector()
    started(t)
    assert answer(t, {0: (10, 0), 1: (8, 10), 2: (0, 6)}) is False  # 2 in flight
    assert t.in_flight == 2
    assert answer(t, {0: (10, 0), 1: (8, 10), 2: (0, 8)}) is False  # balanced once
    assert answer(t, {0: (10, 0), 1: (8, 10), 2: (0, 8)}) is True


def test_balanced_waves_with_different_totals_are_not_enough() -> None:
    # Between the waves records moved (a record circulated and came back): both waves
    # balance, yet the loop was not proven empty for the whole time between them.
    t, _, _ = detector()
    started(t)
    assert answer(t, {0: (10, 0), 1: (5, 10), 2: (0, 5)}) is False
    assert answer(t, {0: (10, 0), 1: (7, 12), 2: (2, 7)}) is False
    assert answer(t, {0: (10, 0), 1: (7, 12), 2: (2, 7)}) is True


def test_an_incomplete_wave_waits_and_late_answers_are_ignored() -> None:
    t, probes, _ = detector()
    started(t)
    t.on_status(P.LoopStatus(0, 0, 1, 3, 3))
    t.on_status(P.LoopStatus(1, 0, 1, 0, 0))
    assert t.on_tick() is False and probes.rounds() == [1]  # task 2 has not answered
    t.on_status(P.LoopStatus(2, 0, 1, 0, 0))
    assert t.on_tick() is False and probes.rounds() == [1, 2]
    t.on_status(P.LoopStatus(2, 0, 1, 99, 0))  # a straggler of wave 1
    assert answer(t, {0: (3, 3), 1: (0, 0), 2: (0, 0)}) is True


def test_waves_are_spaced_by_the_interval() -> None:
    probes, clock = Probes(), Clock()
    t = LoopTermination([0], probes, interval=0.5, clock=clock)
    started(t)
    t.on_status(P.LoopStatus(0, 0, 1, 1, 0))
    assert t.on_tick() is False and probes.rounds() == [1]
    clock.now = 0.6
    assert t.on_tick() is False and probes.rounds() == [1, 2]


def test_a_lost_probe_is_sent_again_to_the_tasks_that_did_not_answer() -> None:
    t, probes, clock = detector()
    started(t)
    t.on_status(P.LoopStatus(0, 0, 1, 0, 0))
    probes.sent.clear()
    clock.now = 0.5
    t.on_tick()
    assert probes.sent == []
    clock.now = 1.2
    t.on_tick()
    assert probes.sent == [(1, P.LoopProbe(1)), (2, P.LoopProbe(1))]
