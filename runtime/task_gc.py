"""Python's cyclic garbage collector in a task process (``JobConfig.gc_threshold``).

CPython frees an object when its last reference goes; the cyclic collector exists only
for garbage that refers to itself. Its young generation is collected after every
``threshold0`` (700 by default) net allocations of container objects (tuples, lists,
dicts ...), and a task allocates exactly those by the batch: a decoded batch of tuple
records, the ``(key, value)`` pairs an operator emits. With the default, a collection
runs in the middle of nearly every batch, finds the batch's records alive (they are
still in flight), and promotes them to the older generations, whose collections then
traverse them again; once promoted objects add up to a quarter of the long-lived ones,
a full collection traverses the whole heap, keyed state included. None of it finds
garbage: the records die by reference counting a moment later.

With ``threshold0`` raised (50,000 by default) a young collection runs every few dozen
batches, when most of the records counted since the last one are already gone, so little
is promoted and full collections are rare. Before the task starts everything already
built (the interpreter's modules, Spark's, the plan and the user's functions) is moved
out of the collector's sight with ``gc.freeze()``, so the collections that do run do not
traverse it. Objects still die by reference counting, and cyclic garbage is still
collected, a little later. Measured on the paper topology at parallelism 2 on local Spark
(twelve processes on two cores, tuple records; ``python benchmarks/inflight.py --only
"default (" GC``): 1.25x the records per second, and aligned checkpoints every 0.1 s of p50 / p99
80 / 99 ms against 108 / 164 ms. The keyed count, whose records are strings (which the
collector does not track), is unchanged.

The settings are process-wide: they are restored, and the frozen objects unfrozen, when
the task ends (a Spark Python worker may be reused for another job's tasks).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def task_gc(threshold: int | None) -> Iterator[None]:
    """Run the body with the young generation's threshold at ``threshold`` and what exists
    now frozen (``gc.freeze``); None leaves the collector as it is."""
    if threshold is None:
        yield
        return
    before = gc.get_threshold()
    gc.set_threshold(threshold, *before[1:])
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
