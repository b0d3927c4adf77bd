"""The output side of a task: its output edges' partitioners and channels.

Records leave through :meth:`TaskOutputs.emit` (partitioned per edge); watermarks
through :meth:`TaskOutputs.send_watermark`, on every output channel (a watermark is
not partitioned: a shuffle broadcasts it, so every downstream subtask learns the
sender's event time). Barriers and end-of-input are sent by the checkpointer on
``channels``. Threading: task-loop thread only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from channels.messages import Event, Watermark
from channels.partitioners import Partitioner
from runtime.plan import JobPlan, TaskSpec
from runtime.task_io import Output, TaskIO


class TaskOutputs:
    """Partitioners and channels of a task's output edges; counts the records sent."""

    def __init__(self) -> None:
        self.edges: list[tuple[Partitioner, list[Output]]] = []
        self.channels: list[Output] = []
        """Every output channel (the same list for the task's lifetime)."""
        self.records_sent = 0

    def open(
        self, io: TaskIO, plan: JobPlan, spec: TaskSpec, on_backpressure: Callable[[], None]
    ) -> None:
        """Connect every output channel."""
        for out in spec.outputs:
            chans = [
                io.output(
                    ch,
                    plan.channels[ch].target_task,
                    on_backpressure,
                    back_edge=plan.channels[ch].back_edge,
                )
                for ch in out.channels
            ]
            self.channels.extend(chans)
            self.edges.append((out.partitioner(len(chans), spec, plan), chans))

    def emit(self, batch: list[Any]) -> None:
        """Partition a batch over the output edges and write it (per batch, not record)."""
        sent = 0
        for partitioner, chans in self.edges:
            for target, part in partitioner.partition(batch):
                chans[target].write(part)
                sent += len(part)
        self.records_sent += sent

    def emit_to(self, edge: int, batch: list[Any]) -> None:
        """Partition a batch over output edge ``edge`` only (a step that routes its
        output itself: an iteration's superstep step, ``runtime.superstep``)."""
        partitioner, chans = self.edges[edge]
        sent = 0
        for target, part in partitioner.partition(batch):
            chans[target].write(part)
            sent += len(part)
        self.records_sent += sent

    def send_event_on(self, edge: int, event: Event) -> None:
        """``event`` on every channel of output edge ``edge``, behind its records."""
        for ch in self.edges[edge][1]:
            ch.send_event(event)

    def send_watermark(self, event: Watermark) -> None:
        for ch in self.channels:
            ch.send_event(event)

    def flush(self) -> None:
        for ch in self.channels:
            ch.flush()

    def flush_if_older(self, now: float, timeout: float) -> None:
        for ch in self.channels:
            ch.flush_if_older(now, timeout)

    def close(self, graceful: bool) -> None:
        for ch in self.channels:
            ch.close(linger_ms=1000 if graceful else 0)
