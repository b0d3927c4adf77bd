"""A transactional sink restored at another parallelism (Flink's union state for
sinks): every old subtask's pending transactions are recovered exactly once.

New sink subtask ``i`` of ``p`` owns the old subtasks ``j`` with ``j % p == i``. For
each old ``j != i`` it opens a copy of the sink *as subtask j* (j's transaction ids,
part files, Delta application id, PostgreSQL gids; j's commits reach the driver as
j's) and runs the sink's usual ``recover``: it commits what the restored checkpoint
covers and aborts what j left after it. Its own old state (if ``i`` existed before)
is then restored as usual.

Why new transaction ids cannot collide with old ones: an id is (job, step, subtask,
checkpoint id); the new job's checkpoints are numbered above the restored one, and
each old subtask's transactions above it were aborted by its one owner here. An old
subtask index the new job no longer has keeps its committed output (its part files,
its rows); its id space is only used again if the job later scales back up, and then
only for checkpoints above every one it committed.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import TYPE_CHECKING, Any

from statebackend.restore import RescaledState

if TYPE_CHECKING:
    from runtime.sinks import TwoPhaseCommitSink

log = logging.getLogger("absflow.sinks")


def recover_rescaled(sink: TwoPhaseCommitSink, state: RescaledState) -> Any:
    """Recover the old subtasks ``sink`` owns now (but its own), and return its own old
    state to restore as usual; a new subtask without an old one gets the restored
    checkpoint with nothing pending (so it aborts what an earlier run at that index
    left after it, and is no fresh start)."""
    ctx = sink.ctx
    parts = [part for _, part in state.parts if part]
    checkpoint = max((int(p["checkpoint"]) for p in parts if "checkpoint" in p), default=None)
    own: Any = None if checkpoint is None else {"pending": [], "checkpoint": checkpoint}
    for j, part in state.mine(ctx.subtask, ctx.parallelism):
        if j == ctx.subtask:
            own = part or own
            continue
        old = as_subtask(sink, j)
        try:
            old.recover_state(part)
        finally:
            old.close()
        log.info(
            "sink '%s'[%d]: recovered the transactions of old subtask %d of %d",
            ctx.step_name,
            ctx.subtask,
            j,
            state.old_parallelism,
        )
    return own


def as_subtask(sink: TwoPhaseCommitSink, j: int) -> TwoPhaseCommitSink:
    """A copy of ``sink`` as constructed, opened as subtask ``j``."""
    ctx = sink.ctx
    send = ctx.send_to_driver if ctx.send_as is None else functools.partial(ctx.send_as, j)
    old = object.__new__(type(sink))
    vars(old).update(sink.unopened)
    old.open(dataclasses.replace(ctx, subtask=j, send_to_driver=send))
    return old
