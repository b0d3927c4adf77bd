"""Restart strategies with a fake clock."""

from __future__ import annotations

import pytest

from jobmanager.restart import (
    ExponentialBackoff,
    FailureRate,
    FixedDelay,
    NoRestart,
    RestartStrategy,
    default_strategy,
)


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def test_no_restart() -> None:
    s = NoRestart()
    assert s.next_delay() is None
    assert s.next_delay() is None
    assert "no restarts" in s.describe()


def test_fixed_delay() -> None:
    s = FixedDelay(attempts=2, delay=0.5)
    assert [s.next_delay() for _ in range(4)] == [0.5, 0.5, None, None]
    assert s.describe() == "fixed delay (2 restarts, 0.5 s apart)"


def test_fixed_delay_zero_attempts() -> None:
    assert FixedDelay(attempts=0).next_delay() is None


def test_failure_rate_gives_up_when_too_many_within_the_interval() -> None:
    clock = Clock()
    s = FailureRate(max_failures=2, interval=10.0, delay=0.25, clock=clock)
    assert s.next_delay() == 0.25
    clock.now += 4
    assert s.next_delay() == 0.25
    clock.now += 4
    assert s.next_delay() is None  # 3 failures within 10 s


def test_failure_rate_forgets_old_failures() -> None:
    clock = Clock()
    s = FailureRate(max_failures=2, interval=10.0, delay=1.0, clock=clock)
    for _ in range(10):  # one failure every 6 s: at most 2 in any 10 s window
        assert s.next_delay() == 1.0
        clock.now += 6
    clock.now -= 6
    clock.now += 1
    assert s.next_delay() is None  # now 3 within 10 s


def test_failure_rate_instances_do_not_share_history() -> None:
    a, b = FailureRate(max_failures=0), FailureRate(max_failures=1)
    assert a.next_delay() is None
    assert b.next_delay() == 1.0


def test_exponential_backoff_doubles_up_to_max() -> None:
    clock = Clock()
    s = ExponentialBackoff(
        initial=0.1, max_delay=1.0, multiplier=2.0, max_attempts=10, reset_after=60.0, clock=clock
    )
    delays = []
    for _ in range(7):
        delays.append(s.next_delay())
        clock.now += 1
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])


def test_exponential_backoff_gives_up_after_max_attempts() -> None:
    clock = Clock()
    s = ExponentialBackoff(initial=1.0, max_delay=100.0, max_attempts=3, clock=clock)
    assert [s.next_delay() for _ in range(3)] == [1.0, 2.0, 4.0]
    assert s.next_delay() is None
    assert s.next_delay() is None


def test_exponential_backoff_resets_after_a_quiet_period() -> None:
    clock = Clock()
    s = ExponentialBackoff(
        initial=0.5, max_delay=8.0, max_attempts=10, reset_after=30.0, clock=clock
    )
    assert s.next_delay() == 0.5
    clock.now += 5
    assert s.next_delay() == 1.0
    clock.now += 30  # exactly reset_after: not quiet long enough
    assert s.next_delay() == 2.0
    clock.now += 30.5
    assert s.next_delay() == 0.5  # back to the initial delay
    clock.now += 1
    assert s.next_delay() == 1.0
    # The attempt budget restarts too: a long-running job is not doomed by old failures.
    assert s.used == 2


def test_describe_mentions_the_settings() -> None:
    assert "at most 3 failures per 60.0 s" in FailureRate().describe()
    assert "at most 10 restarts" in ExponentialBackoff().describe()
    assert RestartStrategy().describe() == "RestartStrategy"
    with pytest.raises(NotImplementedError):
        RestartStrategy().next_delay()


def test_default_strategy() -> None:
    assert isinstance(default_strategy(True), ExponentialBackoff)
    assert isinstance(default_strategy(False), NoRestart)
    assert default_strategy(True) is not default_strategy(True)  # fresh state per job
