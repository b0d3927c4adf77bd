"""An iteration as a loop of the streaming graph: the same `LogicalGraph`, the same
`build_plan` and the same back-edge search (`runtime.plan.find_back_edges`) as a
``Stream.iterate()`` loop, so ``explain()`` and the graph checks show it as a loop.

    <name>:input --forward--> <name> (loop head) --forward, chained--> <step>:step
                                   ^                                         |  |
                                   +--- feedback edge, hash by target key ---+  |
                                        (its back-edge channels: find_back_edges)
                                                    <name>:result (sink) <------+

The head and the step are one chain: one iteration task per partition, which is what
`runtime.iterations.worker` runs. Its inputs on the feedback edge are the channels a
superstep marker must arrive on before the superstep's inbox is complete (FIFO: every
message of superstep k is ahead of marker k on its channel), and its outputs on it are
the peers it sends to; the worker takes both from this plan (`LoopChannels`). The
input source and the result sink are the job manager's side: the input partitions are
files in the run's storage (`runtime.iterations.snapshots`), the result is collected
over the control plane, so their tasks are not started.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.graph import EdgeKind, LogicalGraph, Partitioning, StepKind
from runtime.iterations.api import IterationSpec
from runtime.plan import JobPlan, build_plan

__all__ = ["LoopChannels", "iteration_plan"]


def _message_target(message: Any) -> Any:
    """The key of a (target key, message) pair: what the feedback edge is hashed by."""
    return message[0]


def iteration_graph(spec: IterationSpec) -> LogicalGraph:
    p = spec.parallelism
    graph = LogicalGraph()
    name = graph.unique_name  # checks each name (no '[', no name twice)
    entry = graph.add_step(name(f"{spec.name}:input", ""), StepKind.SOURCE, p)
    head = graph.add_step(name(spec.name, ""), StepKind.ITERATE, p)
    step = graph.add_step(name(f"{spec.step.name}:step", ""), StepKind.FLAT_MAP, p, fn=spec.step)
    result = graph.add_step(name(f"{spec.name}:result", ""), StepKind.SINK, p)
    graph.connect(entry, head, Partitioning.FORWARD)
    graph.connect(head, step, Partitioning.FORWARD)
    graph.connect(step, head, Partitioning.HASH, _message_target, EdgeKind.FEEDBACK)
    graph.connect(step, result, Partitioning.FORWARD)
    graph.validate()
    return graph


def iteration_plan(spec: IterationSpec) -> JobPlan:
    """The physical plan of the iteration (its loop head and step fused in one chain)."""
    return build_plan(iteration_graph(spec), spec.name, max(1, spec.parallelism))


@dataclass(frozen=True)
class LoopChannels:
    """What one iteration task takes from the plan: the partitions whose superstep
    markers it waits for (its feedback-edge inputs, itself included), the peers it
    sends messages to, and how many of its inputs are back-edges."""

    index: int
    marker_sources: tuple[int, ...]
    peers: tuple[int, ...]
    back_edges: int

    @classmethod
    def of(cls, plan: JobPlan, index: int) -> LoopChannels:
        head_chain = next(
            c.id for c in plan.chains if plan.steps[c.step_ids[0]].kind is StepKind.ITERATE
        )
        tasks = [t for t in plan.tasks if t.chain == head_chain]
        task = tasks[index]
        feedback = [
            plan.channels[c]
            for c in task.inputs
            if plan.steps[plan.channels[c].source_step].kind is not StepKind.SOURCE
        ]
        sources = tuple(sorted(plan.tasks[ch.source_task].subtask for ch in feedback))
        out = [
            plan.channels[c]
            for o in task.outputs
            for c in o.channels
            if plan.tasks[plan.channels[c].target_task].chain == head_chain
        ]
        peers = tuple(sorted(plan.tasks[ch.target_task].subtask for ch in out))
        back = sum(1 for ch in feedback if ch.back_edge)
        return cls(index, sources, tuple(j for j in peers if j != index), back)
