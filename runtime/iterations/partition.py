"""One task's partition of an iteration and its superstep logic, free of I/O.

A superstep on one partition: ``emit()`` (the messages its keys send, routed to the
partitions that own the targets, combined per target, plus this partition's in-band
contribution), ``absorb(batch)`` for every batch that arrives (from any partition,
itself included), then ``update(total)``, which computes the next state without
touching the current one: ``committed`` stays readable until the job manager agreed on
the superstep, which is what a rescue read returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import msgpack

from runtime.iterations.api import IterationError, IterationSpec

__all__ = ["Outcome", "PartitionCompute", "Sink", "decode_state", "encode_state"]

CHUNK = 8192
_MISSING = object()


class Sink(Protocol):
    def add(self, items: list[tuple[Any, Any]]) -> None: ...
    def finish(self, workset: set[Any] | None) -> None: ...


def encode_state(solution: dict[Any, Any], workset: set[Any] | None) -> bytes:
    body = [list(solution.items()), None if workset is None else list(workset)]
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return packed


def decode_state(payload: bytes) -> tuple[dict[Any, Any], set[Any] | None]:
    items, workset = msgpack.unpackb(payload, raw=False, use_list=False, strict_map_key=False)
    return dict(items), None if workset is None else set(workset)


@dataclass(frozen=True)
class Outcome:
    """The end of a superstep on one partition."""

    aggregate: float
    active: int  # size of the next workset (delta); keys updated (bulk)


class PartitionCompute:
    """Lifecycle per superstep: ``emit`` -> ``absorb``* -> ``update`` -> ``commit``."""

    def __init__(
        self,
        spec: IterationSpec,
        index: int,
        solution: dict[Any, Any],
        workset: set[Any] | None,
        side: dict[Any, Any],
    ) -> None:
        self.spec, self.index, self.side = spec, index, side
        self.step = spec.step
        self.solution = solution
        self.workset: set[Any] | None = None  # bulk
        if spec.delta:  # a delta iteration always has a workset (maybe empty)
            self.workset = set() if workset is None else workset
        self.next_solution: dict[Any, Any] | None = None
        self.next_workset: set[Any] | None = None
        self.inbox: dict[Any, Any] = {}
        self._owners: dict[Any, int] = {}

    def emit(self) -> tuple[list[list[Any]], float]:
        """``(per destination partition: [key, message, ...] flat), contribution``."""
        step, side, owner = self.step, self.side, self.spec.partitioner.owner
        combine = step.combine
        p = self.spec.parallelism
        keys = self.solution.keys() if self.workset is None else self.workset
        routed: list[dict[Any, Any]] = [{} for _ in range(p)]
        owners = self._owners  # target -> partition, cached: the key set never changes
        messages, contribute = step.messages, step.contribution
        contribution = 0.0
        for key in keys:
            value = self.solution[key]
            s = side.get(key)
            contribution += contribute(key, value, s)
            for target, msg in messages(key, value, s):
                o = owners.get(target)
                if o is None:
                    o = owners[target] = owner(target)
                box = routed[o]
                if combine is not None:
                    prev = box.get(target, _MISSING)
                    box[target] = msg if prev is _MISSING else combine(prev, msg)
                elif target in box:
                    box[target].append(msg)
                else:
                    box[target] = [msg]
        out: list[list[Any]] = []
        for box in routed:
            flat: list[Any] = []
            for k, m in box.items():
                flat.append(k)
                flat.append(m)
            out.append(flat)
        return out, contribution

    def absorb(self, flat: list[Any] | tuple[Any, ...]) -> None:
        inbox, combine, solution = self.inbox, self.step.combine, self.solution
        for i in range(0, len(flat), 2):
            key, msg = flat[i], flat[i + 1]
            if key not in solution:
                raise IterationError(
                    f"step '{self.step.name}' of iteration '{self.spec.name}' sent a message "
                    f"to key {key!r}, which the solution set does not have: a step may not "
                    f"change the key set (add the key to the initial data set)"
                )
            if key in inbox:
                inbox[key] = combine(inbox[key], msg) if combine else inbox[key] + list(msg)
            else:
                inbox[key] = msg if combine else list(msg)

    def update(self, total: float, sink: Sink | None = None) -> Outcome:
        """Compute the next state; ``sink`` gets it in chunks as it is produced (the
        *tail* checkpoint), the workset last."""
        step, side, inbox = self.step, self.side, self.inbox
        if self.workset is None:  # bulk: every key
            new: dict[Any, Any] = {}
            agg = 0.0
            chunk: list[tuple[Any, Any]] = []
            for key, value in self.solution.items():
                s = side.get(key)
                nv = step.update(key, value, inbox.get(key), s, total)
                agg += step.aggregate(key, value, nv)
                new[key] = nv
                if sink is not None:
                    chunk.append((key, nv))
                    if len(chunk) >= CHUNK:
                        sink.add(chunk)
                        chunk = []
            if sink is not None:
                sink.add(chunk)
                sink.finish(None)
            self.next_solution, self.next_workset = new, None
            self.inbox = {}
            return Outcome(agg, len(new))
        changed: dict[Any, Any] = {}
        for key, msgs in inbox.items():
            nv = step.update(key, self.solution[key], msgs, side.get(key), total)
            if nv is not None:
                changed[key] = nv
        nxt = dict(self.solution)
        nxt.update(changed)
        self.next_solution, self.next_workset = nxt, set(changed)
        if sink is not None:
            items = list(nxt.items())
            for i in range(0, len(items), CHUNK):
                sink.add(items[i : i + CHUNK])
            sink.finish(self.next_workset)
        self.inbox = {}
        return Outcome(float(len(changed)), len(changed))

    def commit(self) -> tuple[dict[Any, Any], set[Any] | None]:
        """The superstep was agreed: the new state becomes the current one. Returns the
        state it replaced."""
        if self.next_solution is None:
            raise RuntimeError("commit() without update()")
        old = (self.solution, self.workset)
        self.solution, self.workset = self.next_solution, self.next_workset
        self.next_solution = self.next_workset = None
        return old

    def proposed(self) -> tuple[dict[Any, Any], set[Any] | None]:
        if self.next_solution is None:
            raise RuntimeError("proposed() without update()")
        return self.next_solution, self.next_workset
