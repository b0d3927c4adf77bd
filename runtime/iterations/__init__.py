"""Superstep iterations (seed 004) for users: bulk and delta iterations with optimistic
(compensation) and pessimistic (superstep checkpoint) recovery, run as Dataflows with a
loop on the streaming runtime (``runtime.api.iterations``); ready-made steps and
compensations (``library``) and generated graphs with their references (``graphs``).
See docs/iterations.md."""

from runtime.api.iterations import (
    BulkIteration,
    Compensation,
    DeltaIteration,
    IterationError,
    Recovery,
    Step,
    l1_below,
)

__all__ = [
    "BulkIteration",
    "Compensation",
    "DeltaIteration",
    "IterationError",
    "Recovery",
    "Step",
    "l1_below",
]
