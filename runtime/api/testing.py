"""Unit-test a pipeline without Spark: ``run_local``, ``TestingSource``, ``ListSink``.

    from runtime import Dataflow
    from runtime.api.testing import ABORT, EOF, ListSink, TestingSource, run_local

    out: list[int] = []
    flow = Dataflow("double", parallelism=1)
    flow.source(TestingSource([1, 2, 3]), name="numbers").map(lambda x: 2 * x).sink(
        ListSink(out), name="doubled"
    )
    run_local(flow)  # out == [2, 4, 6]

``run_local`` runs the dataflow on the local launcher (``jobmanager.local_launcher``):
every task is a local Python process, with the same operators, ZeroMQ channels (on
127.0.0.1), checkpoints, restarts and fault injection as on Spark, but no SparkSession
and no JVM (a small job takes about half a second). It is ``flow.run(launcher="local",
...)`` plus filling the ``ListSink`` lists. Spark (``flow.run()``) stays the way to run
a job for real; a setting only Spark can honour (``local_master``, ``executor_wait``) is
refused with a GraphError.

``TestingSource(items)`` emits the items (subtask s of p takes ``items[s::p]``, like
``CollectionSource``) and is replayable from its checkpointed position. Two markers in
the list act where the reading subtask meets them: ``EOF`` ends that subtask's input
there (the items after it are never read), ``ABORT`` makes the source step raise
(``TestingSourceAbort``), which fails the task like any user function: the run ends
with a ``TaskFailedError`` naming the source step (after the restarts the restart
strategy allows). Markers do not count as records.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Generic, TypeVar

from jobmanager.result import JobResult
from runtime.api.dataflow import Dataflow
from runtime.errors import AbsflowError, OperatorFailure
from runtime.graph import StepKind
from runtime.sinks import CollectSink
from runtime.sources import Source, SourceReader

T = TypeVar("T")

__all__ = ["ABORT", "EOF", "ListSink", "TestingSource", "TestingSourceAbort", "run_local"]


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"runtime.api.testing.{self.name}"

    def __reduce__(self) -> str:  # one object per process, also after pickling
        return self.name


EOF = _Marker("EOF")
ABORT = _Marker("ABORT")


class TestingSourceAbort(AbsflowError, RuntimeError):
    """Raised by a ``TestingSource`` that reached an ``ABORT`` marker."""

    __test__ = False  # not a pytest test class


class _TestingReader(SourceReader[T]):
    def __init__(
        self, items: Sequence[T | _Marker], step: str, subtask: int, parallelism: int
    ) -> None:
        self.items = list(items[subtask::parallelism])
        self.step, self.subtask = step, subtask
        self.pos = 0  # index into items (markers included)
        self.records = 0  # records emitted before pos

    def read_batch(self, max_records: int) -> list[T] | None:
        if self.pos >= len(self.items):
            return None
        head = self.items[self.pos]
        if head is EOF:
            return None
        if head is ABORT:
            err = TestingSourceAbort(
                f"testing source '{self.step}' (subtask {self.subtask}) reached ABORT after "
                f"{self.records} record(s)"
            )
            raise OperatorFailure(self.step, err)
        batch: list[T] = []
        while len(batch) < max_records and self.pos < len(self.items):
            item = self.items[self.pos]
            if isinstance(item, _Marker):  # EOF or ABORT: the only markers
                break
            batch.append(item)
            self.pos += 1
        self.records += len(batch)
        return batch

    def snapshot(self) -> object:
        return [self.pos, self.records]

    def restore(self, state: Any) -> None:
        self.pos, self.records = int(state[0]), int(state[1])


class TestingSource(Source[T]):
    """The items of a list, with ``EOF`` (end here) and ``ABORT`` (raise here) markers."""

    __test__ = False  # not a pytest test class
    name = "testing"

    def __init__(self, items: Iterable[T | _Marker]) -> None:
        self.items = list(items)
        self.step = "source"

    def validate(self, step_name: str) -> None:
        self.step = step_name  # the name the failure of an ABORT reports

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader[T]:
        return _TestingReader(self.items, self.step, subtask, parallelism)


class ListSink(CollectSink, Generic[T]):
    """Collects the records (exactly once, like ``collect()``) into ``target``, a list of
    the test process that ``run_local`` extends when the run finished (the tasks run in
    other processes: the list does not travel to them)."""

    def __init__(self, target: list[T]) -> None:
        if not isinstance(target, list):
            raise TypeError(f"ListSink needs a list to fill, got {type(target).__name__}")
        self.target = target

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["target"] = []  # the tasks' copy: the records travel as committed output
        return state


def run_local(flow: Dataflow, **run_options: Any) -> JobResult:
    """Run ``flow`` to completion as local processes, without Spark; fill its ``ListSink``
    lists (in commit order) and return the ``JobResult``. ``run_options`` are those of
    ``Dataflow.run``: ``restore_from``, ``faults`` and JobConfig settings."""
    if run_options.get("launcher", "local") != "local":
        raise AbsflowError(
            f"run_local runs on the local launcher; for launcher={run_options['launcher']!r} "
            "call flow.run(...) instead."
        )
    result = flow.run(**{**run_options, "launcher": "local"})
    for step in flow.graph.steps:
        if step.kind is StepKind.SINK and isinstance(step.fn, ListSink):
            step.fn.target.extend(result.output(step.name))
    return result
