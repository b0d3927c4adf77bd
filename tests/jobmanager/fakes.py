"""Reusable fakes for the job manager's objects: a clock, a scripted ROUTER link, a
barrier stage, a disconnect monitor, and a small plan (no Spark, no sockets)."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from typing import Any

from runtime import control as P
from runtime.api.dataflow import Dataflow
from runtime.plan import JobPlan
from runtime.sources import GeneratorSource


def ident(x: Any) -> Any:
    return x


def last(_a: Any, b: Any) -> Any:
    return b


def small_plan() -> JobPlan:
    """src[0], src[1] --hash--> count[0], count[1] (chained with the collect sink "out");
    task indexes 0..3: 0, 1 are the sources, 2, 3 the sink tasks."""
    flow = Dataflow("job", parallelism=2)
    flow.source(GeneratorSource(ident, 10), name="src").key_by(ident).reduce(
        last, name="count"
    ).collect("out")
    plan = flow.plan()
    assert [t.task_id for t in plan.tasks] == ["src[0]", "src[1]", "count[0]", "count[1]"]
    return plan


class Clock:
    """Monotonic seconds under the test's control."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class LoopGuard(Exception):
    """A scripted attempt loop ran far longer than its script (a bug in the test or code)."""


class ScriptedLink:
    """The ROUTER as an attempt sees it: each ``receive`` hands out the next scripted
    batch of messages (or a callable's result, or raises a scripted exception) and
    advances the clock by ``tick`` seconds; ``sent`` records (task, attempt, message)."""

    def __init__(self, clock: Clock, tick: float = 0.02, limit: int = 100_000) -> None:
        self.clock, self.tick, self.limit = clock, tick, limit
        self.script: list[Any] = []
        self.sent: list[tuple[int, int, P.Message]] = []
        self.polls = 0

    def then(self, *items: Any) -> ScriptedLink:
        """Queue one receive's worth: messages, or a single exception to raise."""
        self.script.append(list(items))
        return self

    def then_do(self, action: Callable[[], None]) -> ScriptedLink:
        """Queue one receive that runs ``action`` (a side effect) and hands out nothing."""

        def run() -> list[Any]:
            action()
            return []

        return self.then(run)

    def receive(self, timeout_ms: int) -> Iterator[P.Message]:
        self.polls += 1
        if self.polls > self.limit:
            raise LoopGuard(f"{self.limit} polls")
        self.clock.advance(self.tick)
        if not self.script:
            return iter(())
        batch = self.script.pop(0)
        if len(batch) == 1 and isinstance(batch[0], BaseException):
            raise batch[0]
        if len(batch) == 1 and callable(batch[0]):
            batch = list(batch[0]())
        return iter(batch)

    def send(self, task_index: int, attempt: int, msg: P.Message) -> None:
        self.sent.append((task_index, attempt, msg))

    def sent_of(self, kind: type[P.Message]) -> list[tuple[int, P.Message]]:
        return [(i, m) for i, _a, m in self.sent if isinstance(m, kind)]


class FakeStage:
    def __init__(self) -> None:
        self.outcome: queue.Queue[BaseException | None] = queue.Queue()
        self.cancelled = False
        self.joined = 0

    def cancel(self) -> None:
        self.cancelled = True

    def join(self, timeout: float) -> bool:
        self.joined += 1
        return True


class FakeMonitor:
    """The ROUTER's disconnect monitor: ``disconnect()`` queues one event."""

    def __init__(self) -> None:
        self.events = 0

    def disconnect(self) -> None:
        self.events += 1

    def poll(self, timeout: int) -> int:
        return 1 if self.events else 0

    def recv_multipart(self) -> Any:
        self.events -= 1
        return [b"event", b"addr"]


class Processes:
    """Fake process table: pids alive, signals sent, ports bound."""

    def __init__(self, alive: set[int] | None = None) -> None:
        self.alive: set[int] = set(alive or ())
        self.signals: list[tuple[int, int]] = []
        self.bound: set[str] = set()

    def is_alive(self, pid: int) -> bool:
        return pid in self.alive

    def port_in_use(self, endpoint: str) -> bool:
        return endpoint in self.bound

    def signal(self, pid: int, sig: int) -> None:
        self.signals.append((pid, sig))
        self.alive.discard(pid)


class NoProgress:
    def __init__(self) -> None:
        self.updates = 0

    def update(self, *args: Any) -> None:
        self.updates += 1
