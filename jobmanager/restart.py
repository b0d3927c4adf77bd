"""Restart strategies: how often and how soon a failed job is restarted from its
latest completed checkpoint (Flink's fixed-delay, failure-rate and
exponential-delay strategies). Driver side only."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


class RestartStrategy:
    """``next_delay()`` is asked once per failure: seconds to wait, or None to give up."""

    def next_delay(self) -> float | None:
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__


@dataclass
class NoRestart(RestartStrategy):
    """Fail the job at the first failure (the default when checkpointing is off)."""

    def next_delay(self) -> float | None:
        return None

    def describe(self) -> str:
        return "no restarts (checkpointing is off; set checkpoint_interval or a restart_strategy)"


@dataclass
class FixedDelay(RestartStrategy):
    attempts: int = 3
    delay: float = 1.0
    used: int = 0

    def next_delay(self) -> float | None:
        if self.used >= self.attempts:
            return None
        self.used += 1
        return self.delay

    def describe(self) -> str:
        return f"fixed delay ({self.attempts} restarts, {self.delay} s apart)"


@dataclass
class FailureRate(RestartStrategy):
    """Give up when more than ``max_failures`` failures happen within ``interval`` seconds."""

    max_failures: int = 3
    interval: float = 60.0
    delay: float = 1.0
    clock: Callable[[], float] = time.monotonic
    failures: deque[float] = field(default_factory=deque)

    def next_delay(self) -> float | None:
        now = self.clock()
        self.failures.append(now)
        while self.failures and now - self.failures[0] > self.interval:
            self.failures.popleft()
        if len(self.failures) > self.max_failures:
            return None
        return self.delay

    def describe(self) -> str:
        return f"failure rate (at most {self.max_failures} failures per {self.interval} s)"


@dataclass
class ExponentialBackoff(RestartStrategy):
    """Delays initial, initial*multiplier, ... up to max_delay; at most ``max_attempts``
    restarts in a row; delay and count reset after ``reset_after`` seconds without a failure."""

    initial: float = 0.1
    max_delay: float = 10.0
    multiplier: float = 2.0
    max_attempts: int = 10
    reset_after: float = 60.0
    clock: Callable[[], float] = time.monotonic
    used: int = 0
    current: float = 0.0
    last_failure: float | None = None

    def next_delay(self) -> float | None:
        now = self.clock()
        if self.last_failure is not None and now - self.last_failure > self.reset_after:
            self.current = 0.0  # a quiet period: start over, delays and attempts
            self.used = 0
        self.last_failure = now
        if self.used >= self.max_attempts:
            return None
        self.used += 1
        self.current = (
            self.initial
            if self.current == 0.0
            else min(self.max_delay, self.current * self.multiplier)
        )
        return self.current

    def describe(self) -> str:
        return (
            f"exponential back-off ({self.initial} s x{self.multiplier} up to {self.max_delay} s, "
            f"at most {self.max_attempts} restarts)"
        )


def default_strategy(checkpointing: bool) -> RestartStrategy:
    """Flink's defaults: exponential delay with checkpointing, no restarts without."""
    return ExponentialBackoff() if checkpointing else NoRestart()
