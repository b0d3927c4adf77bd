"""Superstep iterations (seed 004): bulk and delta iterations with optimistic
(compensation) and pessimistic (superstep checkpoint) recovery. See docs/iterations.md."""

from runtime.iterations.api import (
    BulkIteration,
    DeltaIteration,
    IterationError,
    KeyPartitioner,
    Partitioned,
    Recovery,
    Step,
    l1_below,
)

__all__ = [
    "BulkIteration",
    "DeltaIteration",
    "IterationError",
    "KeyPartitioner",
    "Partitioned",
    "Recovery",
    "Step",
    "l1_below",
]
