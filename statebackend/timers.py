"""Checkpointed timers per key: event-time and processing-time, in keyed state.

Timers are keyed state like any other (``KeyedStateBackend.map_state``): the map state
``__timers/event`` (or ``__timers/processing``) holds, per key, ``{(timestamp,
namespace): None}`` for each pending timer of that key. So they are snapshotted with the operator's keyed
state, split by key group, and restored at any parallelism with the keys a subtask owns.

A heap orders the pending timers of a subtask for firing; it is an index rebuilt from
the map state on restore (never snapshotted), with lazy deletion: a popped entry fires
only if the map state still holds it.

Exactly once across restores follows from the snapshot being taken between two
batches: a timer that fired before the checkpoint was removed from the map state
before the snapshot (it never fires again); one that had not fired is in the
snapshot and fires once the (restored) time passes it.

**Namespaces**: a timer (and ``NamespacedState``) carries a namespace, e.g. a window
``(start, end)``; a timer is unique per (key, timestamp, namespace).

Threading: task-loop thread only.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from typing import Any, Generic

from typing_extensions import TypeVar

from statebackend.keyed import KeyedStateBackend

# Keys are the user's: passed along, never looked inside (object). A timer's namespace and
# a namespaced state's namespace and value are the operator's own (a window, a side and
# a timestamp, ...): its operator names their types.
N = TypeVar("N", default=object)
V = TypeVar("V", default=object)


def _touch(backend: KeyedStateBackend, key: object) -> None:
    """``key``'s state changed (incremental checkpoints: ``KeyedStateBackend.changed``)."""
    changed = backend.changed
    if changed is not None:
        changed.add(key)


EVENT_TIME = "event"
PROCESSING_TIME = "processing"


class TimerQueue(Generic[N]):
    """The pending timers of one time domain, by key; see the module docstring."""

    __slots__ = ("_backend", "_heap", "_seq", "_timers", "domain")

    def __init__(self, backend: KeyedStateBackend, domain: str) -> None:
        self.domain = domain
        self._backend = backend  # its changed keys (incremental checkpoints), when tracked
        # key -> {(timestamp, namespace): None}: the checkpointed truth
        self._timers: dict[object, dict[tuple[float, N], None]] = backend.map_state(
            f"__timers/{domain}"
        )
        self._heap: list[tuple[float, int, object, N]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return sum(len(t) for t in self._timers.values())

    def register(self, key: object, timestamp: float, namespace: N) -> None:
        """A timer for ``key`` at ``timestamp`` (once per (key, timestamp, namespace))."""
        timers = self._timers.get(key)
        if timers is None:
            timers = self._timers[key] = {}
        entry = (timestamp, namespace)
        if entry not in timers:
            timers[entry] = None
            heapq.heappush(self._heap, (timestamp, next(self._seq), key, namespace))
            _touch(self._backend, key)

    def delete(self, key: object, timestamp: float, namespace: N) -> None:
        timers = self._timers.get(key)
        if timers is not None and (timestamp, namespace) in timers:
            del timers[(timestamp, namespace)]
            if not timers:
                del self._timers[key]
            _touch(self._backend, key)

    def next_time(self) -> float | None:
        """The earliest pending timer (stale heap entries are dropped on the way)."""
        heap = self._heap
        while heap:
            ts, _, key, namespace = heap[0]
            timers = self._timers.get(key)
            if timers is not None and (ts, namespace) in timers:
                return ts
            heapq.heappop(heap)
        return None

    def due(self, time: float) -> Iterator[tuple[object, float, N]]:
        """Pop and yield ``(key, timestamp, namespace)`` of every timer <= ``time``, in
        timestamp order. Each is removed before it is yielded, so a timer registered by
        the callback for a time <= ``time`` fires in the same pass."""
        heap, all_timers = self._heap, self._timers
        while heap and heap[0][0] <= time:
            ts, _, key, namespace = heapq.heappop(heap)
            timers = all_timers.get(key)
            entry = (ts, namespace)
            if timers is None or entry not in timers:
                continue  # deleted, or a duplicate entry of a re-registered timer
            del timers[entry]
            if not timers:
                del all_timers[key]
            _touch(self._backend, key)
            yield key, ts, namespace

    def rebuild(self) -> None:
        """Re-index after a restore merged timers into the map state."""
        seq = self._seq
        self._heap = [
            (ts, next(seq), key, ns) for key, entries in self._timers.items() for ts, ns in entries
        ]
        heapq.heapify(self._heap)

    def clear(self) -> None:
        """Forget every timer (a debug switch: restore without timers)."""
        self._timers.clear()
        self._heap.clear()


class TimerService(Generic[N]):
    """Event-time and processing-time timers of one keyed operator instance."""

    __slots__ = ("event", "processing")

    def __init__(self, backend: KeyedStateBackend) -> None:
        self.event: TimerQueue[N] = TimerQueue(backend, EVENT_TIME)
        self.processing: TimerQueue[N] = TimerQueue(backend, PROCESSING_TIME)

    def rebuild(self) -> None:
        self.event.rebuild()
        self.processing.rebuild()

    def clear(self) -> None:
        self.event.clear()
        self.processing.clear()


class NamespacedState(Generic[N, V]):
    """Keyed state per (key, namespace): map state ``name`` holds ``{namespace: value}``
    per key (e.g. a window's accumulator per window). Rescales with its key."""

    __slots__ = ("_backend", "_states")

    def __init__(self, backend: KeyedStateBackend, name: str) -> None:
        self._states: dict[object, dict[N, V]] = backend.map_state(name)
        self._backend = backend

    def get(self, key: object, namespace: N, default: Any = None) -> Any:
        """The value, else ``default`` (a sentinel of the caller's: any type)."""
        m = self._states.get(key)
        return default if m is None else m.get(namespace, default)

    def put(self, key: object, namespace: N, value: V) -> None:
        m = self._states.get(key)
        if m is None:
            m = self._states[key] = {}
        m[namespace] = value
        _touch(self._backend, key)

    def pop(self, key: object, namespace: N) -> V | None:
        m = self._states.get(key)
        if m is None:
            return None
        value = m.pop(namespace, None)
        if not m:
            del self._states[key]
        _touch(self._backend, key)
        return value

    @property
    def by_key(self) -> dict[object, dict[N, V]]:
        """The live ``{key: {namespace: value}}`` (a per-record fast path's direct access;
        drop a key's map once it is empty, as ``pop`` does, and add each key written to
        the backend's ``changed`` keys when they are tracked)."""
        return self._states

    def namespaces(self, key: object) -> dict[N, V]:
        """The live ``{namespace: value}`` of ``key`` (empty if none; do not keep it)."""
        return self._states.get(key) or {}

    def __len__(self) -> int:
        return sum(len(m) for m in self._states.values())
