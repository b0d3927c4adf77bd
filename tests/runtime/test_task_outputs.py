"""A task's output side (runtime/task_outputs.py) on a real plan and fake channels: one
channel per target subtask and edge, every record on exactly one channel of every edge
(a key always on the same one), events and watermarks on every channel they are for."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from channels.messages import EndOfInput, Event, Watermark
from runtime.api.dataflow import Dataflow
from runtime.sources import CollectionSource
from runtime.task_outputs import TaskOutputs


@dataclass
class RecordingOutput:
    channel: int
    target_task: int
    back_edge: bool
    records: list[Any] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    closed_with: int | None = None

    def write(self, records: list[Any]) -> None:
        self.records += records

    def send_event(self, event: Event) -> None:
        self.events.append(event)

    def flush(self) -> None:
        pass

    def flush_if_older(self, now: float, timeout: float) -> None:
        pass

    def close(self, linger_ms: int = 0) -> None:
        self.closed_with = linger_ms


class RecordingIO:
    def __init__(self) -> None:
        self.outputs: list[RecordingOutput] = []

    def output(
        self, channel: int, target: int, on_backpressure: Callable[[], None], back_edge: bool
    ) -> RecordingOutput:
        self.outputs.append(RecordingOutput(channel, target, back_edge))
        return self.outputs[-1]


def first(record: Any) -> Any:
    return record[0]


def two_edges() -> tuple[TaskOutputs, list[list[RecordingOutput]]]:
    """src (x1) -hash-> m (x2); src -rebalance-> f (x3): the source task's outputs, open,
    and the channels of each edge."""
    flow = Dataflow("out", parallelism=1)
    src = flow.source(CollectionSource([("a", 1)]), name="src")
    src.key_by(first).map(lambda r: r, name="m", parallelism=2).collect("o1")
    src.rebalance().filter(bool, name="f", parallelism=3).collect("o2")
    plan = flow.plan()
    spec = next(t for t in plan.tasks if t.task_id == "src[0]")
    outputs, io = TaskOutputs(), RecordingIO()
    outputs.open(io, plan, spec, lambda: None)  # type: ignore[arg-type]
    assert [id(o) for o in outputs.channels] == [id(o) for o in io.outputs]
    assert [o.channel for o in io.outputs] == [c for e in spec.outputs for c in e.channels]
    edges: list[list[Any]] = [chans for _, chans in outputs.edges]
    return outputs, sorted(edges, key=len)


BATCH = [(f"k{i % 7}", i) for i in range(40)]


def test_one_channel_per_target_subtask_of_every_edge() -> None:
    outputs, (hashed, rebalanced) = two_edges()
    assert len(hashed) == 2 and len(rebalanced) == 3
    channels = hashed + rebalanced
    assert len(outputs.channels) == 5 and len({o.channel for o in channels}) == 5
    assert not any(o.back_edge for o in channels)


def test_every_record_goes_once_to_every_edge_and_a_key_to_one_channel() -> None:
    outputs, (hashed, rebalanced) = two_edges()
    outputs.emit(BATCH)
    outputs.emit(BATCH)
    assert outputs.records_sent == 4 * len(BATCH)
    for edge in (hashed, rebalanced):
        assert sorted(r for o in edge for r in o.records) == sorted(BATCH + BATCH)
    keys_per_channel = [{first(r) for r in o.records} for o in hashed]
    assert not keys_per_channel[0] & keys_per_channel[1]
    assert all(o.records for o in rebalanced)  # spread over every subtask


def test_emit_to_and_send_event_on_reach_one_edge_only() -> None:
    outputs, (hashed, rebalanced) = two_edges()
    edge = next(i for i, (_, chans) in enumerate(outputs.edges) if len(chans) == 3)
    outputs.emit_to(edge, BATCH)
    outputs.send_event_on(edge, EndOfInput())
    assert outputs.records_sent == len(BATCH)
    assert not any(o.records or o.events for o in hashed)
    assert sum(len(o.records) for o in rebalanced) == len(BATCH)
    assert all(o.events == [EndOfInput()] for o in rebalanced)


def test_a_watermark_goes_on_every_channel_and_close_lingers_only_when_graceful() -> None:
    outputs, edges = two_edges()
    outputs.send_watermark(Watermark(42))
    assert all(o.events == [Watermark(42)] for edge in edges for o in edge)
    outputs.close(graceful=True)
    assert {o.closed_with for edge in edges for o in edge} == {1000}
    outputs.close(graceful=False)
    assert {o.closed_with for edge in edges for o in edge} == {0}
