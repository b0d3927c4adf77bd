"""The timestamp assigner: event timestamps and watermarks, chained right after a source.

``stream.assign_timestamps(ts_fn, max_delay=..., idle_timeout=...)`` on a source's
stream adds an ``assign_timestamps`` step, fused into the source's chain. Per batch it
takes the batch's largest timestamp (one pass of ``ts_fn``, checked to be a number)
into the `WatermarkGenerator` of its split; after the batch the task asks
:meth:`TimestampAssigner.poll` for a watermark to send (bounded out-of-orderness, per
split, idleness). The records themselves pass through unchanged: downstream event-time
steps read a record's timestamp with the same ``ts_fn`` (see ``runtime.timestamps``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from channels.messages import Watermark
from runtime.graph import Step, StepKind
from runtime.operators import Operator, OperatorContext, register
from runtime.timestamps import TimestampError
from runtime.watermarks import WatermarkGenerator


def check_timestamps(step: str, batch: list[Any], ts_fn: Callable[[Any], Any]) -> float:
    """The largest timestamp of a non-empty ``batch``; TimestampError names the step and
    the first record whose timestamp is not an int or float."""
    try:
        top = max(map(ts_fn, batch))
    except TypeError:
        top = None
    if top.__class__ is int or top.__class__ is float:
        return top
    for record in batch:
        ts = ts_fn(record)
        if ts.__class__ is not int and ts.__class__ is not float:
            raise TimestampError.of(step, record, ts)
    raise TimestampError(f"step '{step}': timestamps of a batch do not compare")


@register(StepKind.ASSIGN_TIMESTAMPS)
class TimestampAssigner(Operator):
    """Watermarks of one source subtask; records pass through. Task-loop thread only."""

    uses_event_time = True

    def __init__(self, step: Step, ctx: OperatorContext) -> None:
        super().__init__(step, ctx)
        self.ts_fn: Callable[[Any], Any] = step.fn
        self.generator = WatermarkGenerator(step.args["max_delay"], step.args["idle_timeout"])
        self.max_drift: float | None = step.args.get("max_drift")
        self.split_of: Callable[[], Any] = lambda: None
        """The split the current batch came from (set by the chain from its reader)."""
        self.ended_splits: Callable[[], list[Any]] = list
        self.clock: Callable[[], float] = time.monotonic
        self._started = self.clock()
        self._sent = self.generator.current
        self._idle = False
        self._drop = ctx.debug_drop_event_time

    def process(self, batch: list[Any], side: int = 0) -> list[Any]:
        if batch:
            top = check_timestamps(self.name, batch, self.ts_fn)
            self.generator.observe(self.split_of(), top, self.clock())
        return batch

    @property
    def idle(self) -> bool:
        """Marked idle (it read nothing for ``idle_timeout``): it holds no watermark back."""
        return self._idle

    def poll(self) -> Watermark | None:
        """The watermark to send now, if any: an advanced one, idleness, or the end of
        idleness (resumed records hold the watermark again)."""
        gen, now = self.generator, self.clock()
        for split in self.ended_splits():
            gen.end_split(split)
        if gen.idle(now, now - self._started):
            if self._idle:
                return None
            self._idle = True
            return Watermark(self._sent, idle=True)
        wm = gen.watermark(now)
        if wm is None:
            return None
        if self._idle or wm > self._sent:
            self._idle = False
            self._sent = wm
            self.watermark = wm
            return Watermark(wm)
        return None

    def snapshot_state(self, checkpoint_id: int) -> Any:
        return self.generator.snapshot()

    def restore_state(self, state: Any) -> None:
        if state is None or self._drop:
            return
        self.generator.restore(state, self.clock())
        self._sent = self.watermark = self.generator.current
