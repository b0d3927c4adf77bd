"""Step ids that a restore can trust.

State in a checkpoint is matched to a step by its name. A name the user gave
(``name=``) is an explicit id, like Flink's ``uid``: it is the user's promise that the
step is the same across versions of the job. A name absflow made up (``aggregate_2``:
the second aggregate built) depends on the order the steps were built in, so it shifts
when a step of the same kind is inserted before it, and a restore by name alone would
load one operator's state into another.

So every auto-named step also gets a **signature**: a hash of its position in the graph,
made of its kind and the stateful steps (every kind but map, flat_map, filter and union;
with their names when explicit) upstream and downstream of it. Stateless steps (map,
flat_map, filter, union) are transparent: inserting, removing or renaming them does not
change any signature. The checkpoint records each auto-named step's signature; a
restore loads the state of an auto-named step only into the step of that name with the
same signature, and otherwise refuses, naming the step and the fix (give the step the
name it had: ``name='aggregate_2'``; see ``statebackend.restore``). Steps that stand in
exactly the same position (two unnamed sources unioned) are told apart by build order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from runtime.graph import EdgeKind, LogicalGraph, Step, StepKind

STATELESS = frozenset({StepKind.MAP, StepKind.FLAT_MAP, StepKind.FILTER, StepKind.UNION})
"""Kinds that hold no state; every other kind (sources, keyed steps, windows, timestamp
assigners, loop heads, sinks, and any kind added later) counts as stateful."""


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _label(step: Step) -> str:
    """A stateful step as other steps' signatures see it."""
    impl = type(step.fn).__name__ if step.kind in (StepKind.SOURCE, StepKind.SINK) else ""
    return f"{step.kind.value}:{impl}:{'' if step.auto else step.name}"


class _Context:
    """The stateful steps upstream and downstream of each step (memoized, so the cost
    is linear in the graph; feedback edges are left out: they close loops). A stateless
    neighbour contributes its own neighbours, so it leaves no trace."""

    def __init__(self, graph: LogicalGraph) -> None:
        self.graph = graph
        self.up: dict[int, frozenset[str]] = {}
        self.down: dict[int, frozenset[str]] = {}

    def _side(
        self,
        step: Step,
        memo: dict[int, frozenset[str]],
        neighbours: Callable[[Step], list[int]],
    ) -> frozenset[str]:
        if step.id not in memo:
            parts: set[str] = set()
            for other_id in neighbours(step):
                other = self.graph.step(other_id)
                further = self._side(other, memo, neighbours)
                if other.kind not in STATELESS:
                    parts.add(f"({_label(other)}<{_digest(','.join(sorted(further)))})")
                else:
                    parts |= further
            memo[step.id] = frozenset(parts)
        return memo[step.id]

    def upstream(self, step: Step) -> str:
        up = self._side(
            step, self.up, lambda s: [e.source for e in s.inputs if e.kind is EdgeKind.REGULAR]
        )
        return ",".join(sorted(up))

    def downstream(self, step: Step) -> str:
        down = self._side(
            step,
            self.down,
            lambda s: [e.target for e in s.outputs if e.kind is EdgeKind.REGULAR],
        )
        return ",".join(sorted(down))


def assign_signatures(graph: LogicalGraph) -> None:
    """Set ``step.signature`` of every auto-named step (explicitly named: "")."""
    context = _Context(graph)
    seen: dict[str, int] = {}
    for step in graph.steps:
        if not step.auto:
            step.signature = ""
            continue
        base = _digest(f"{_label(step)}|{context.upstream(step)}|{context.downstream(step)}")
        twin = seen.get(base, 0)  # steps in the very same position: by build order
        seen[base] = twin + 1
        step.signature = base if twin == 0 else _digest(f"{base}#{twin}")
