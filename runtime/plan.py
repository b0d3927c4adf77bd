"""The physical plan: chains of operators, their tasks, and the channels between tasks.

Forward-connected steps of equal parallelism are fused into one chain (one task
per subtask); records inside a chain are passed as Python lists, never
serialized. Every remaining edge becomes one FIFO channel per (producer subtask,
consumer subtask) pair it can route to.

Loops make the graph cyclic. Its **back-edges** are found by a depth-first search
from the source tasks over the task graph: a channel into a task on the DFS stack
is a back-edge. Removing them leaves a DAG (the search's own proof); the task that
receives a back-edge channel logs it during checkpoints (cyclic ABS) and never
blocks it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from channels.partitioners import (
    BroadcastPartitioner,
    ForwardPartitioner,
    HashPartitioner,
    Partitioner,
    RebalancePartitioner,
)
from runtime.errors import GraphError
from runtime.graph import EdgeKind, LogicalGraph, Partitioning, Step, StepKind
from runtime.step_ids import assign_signatures
from statebackend.metadata import StepState


def step_state(step: Step) -> StepState:
    """``step`` as checkpoints record it (name, kind, parallelism, keyed; an auto-named
    step's signature, see runtime.step_ids; whether a source or sink redistributes its
    state at another parallelism: its ``rescalable``)."""
    io = step.kind in (StepKind.SOURCE, StepKind.SINK)
    rescalable = io and bool(getattr(step.fn, "rescalable", False))
    return StepState(
        step.name, step.kind.value, step.parallelism, step.kind.keyed, step.signature, rescalable
    )


@dataclass(slots=True)
class Chain:
    id: int
    step_ids: list[int]
    parallelism: int
    name: str  # the head step's name; tasks are "<name>[<subtask>]"


@dataclass(slots=True)
class ChannelSpec:
    id: int
    source_step: int
    target_step: int
    source_task: int
    target_task: int
    partitioning: Partitioning
    back_edge: bool = False
    """Closes a cycle: logged during checkpoints, never blocked (see find_back_edges)."""


@dataclass(slots=True)
class OutputSpec:
    """One output edge of a chain's tail: a partitioner over ``channels`` (by target subtask)."""

    partitioning: Partitioning
    key_fn: Callable[[Any], Any] | None
    channels: list[int]  # channel ids, index = target subtask (one entry for FORWARD)
    target_task_ids: list[str]

    def partitioner(self, n: int, sender: TaskSpec, plan: JobPlan) -> Partitioner:
        """The partitioner of this edge over its ``n`` channels, as ``sender`` uses it."""
        if self.partitioning is Partitioning.FORWARD:
            return ForwardPartitioner(0)
        if self.partitioning is Partitioning.HASH:
            if self.key_fn is None:
                raise GraphError(f"task {sender.task_id}: a hash output has no key function")
            return HashPartitioner(self.key_fn, n, plan.max_parallelism)
        if self.partitioning is Partitioning.REBALANCE:
            return RebalancePartitioner(n, start=sender.subtask % n)
        return BroadcastPartitioner(n)


@dataclass(slots=True)
class TaskSpec:
    index: int  # global task index == Spark partition id
    chain: int
    subtask: int
    task_id: str  # e.g. "count[1]"
    inputs: list[int] = field(default_factory=list)  # channel ids
    outputs: list[OutputSpec] = field(default_factory=list)
    back_edge_inputs: list[int] = field(default_factory=list)
    """The subset of ``inputs`` that are back-edge channels."""

    @property
    def regular_inputs(self) -> list[int]:
        back = set(self.back_edge_inputs)
        return [c for c in self.inputs if c not in back]


@dataclass(slots=True)
class JobPlan:
    name: str
    steps: list[Step]
    chains: list[Chain]
    tasks: list[TaskSpec]
    channels: list[ChannelSpec]
    max_parallelism: int

    @property
    def has_loops(self) -> bool:
        return any(c.back_edge for c in self.channels)

    def chain_steps(self, task: TaskSpec) -> list[Step]:
        return [self.steps[s] for s in self.chains[task.chain].step_ids]

    def step_states(self) -> tuple[StepState, ...]:
        """Every step as a checkpoint restore is checked against."""
        return tuple(step_state(s) for s in self.steps)

    def task_by_id(self, task_id: str) -> TaskSpec:
        for t in self.tasks:
            if t.task_id == task_id:
                return t
        raise KeyError(task_id)

    def resolve_task(self, ref: str) -> TaskSpec:
        """Find a task by ``name[i]`` where name is any step of its chain (for fault injection)."""
        if "[" not in ref or not ref.endswith("]"):
            raise ValueError(
                f"task reference {ref!r} must look like 'step[subtask]', e.g. 'count[1]'"
            )
        name, _, rest = ref.partition("[")
        try:
            subtask = int(rest[:-1])
        except ValueError:
            raise ValueError(
                f"task reference {ref!r}: subtask {rest[:-1]!r} is not an int"
            ) from None
        for chain in self.chains:
            if any(self.steps[s].name == name for s in chain.step_ids):
                for t in self.tasks:
                    if t.chain == chain.id and t.subtask == subtask:
                        return t
                raise ValueError(
                    f"task {ref!r}: step '{name}' has parallelism {chain.parallelism}, "
                    f"subtasks are 0..{chain.parallelism - 1}"
                )
        known = ", ".join(s.name for s in self.steps)
        raise ValueError(f"task {ref!r}: no step named '{name}' (steps: {known})")

    @property
    def aligned_sources(self) -> frozenset[int]:
        """Tasks of sources whose watermarks are aligned (``assign_timestamps`` with a
        ``max_drift``)."""
        return frozenset(
            t.index
            for t in self.tasks
            if any(
                s.kind is StepKind.ASSIGN_TIMESTAMPS and s.args.get("max_drift") is not None
                for s in self.chain_steps(t)
            )
        )

    @property
    def source_tasks(self) -> list[TaskSpec]:
        return [
            t
            for t in self.tasks
            if self.steps[self.chains[t.chain].step_ids[0]].kind is StepKind.SOURCE
        ]

    def explain(self) -> str:
        lines = [
            f"Physical plan of '{self.name}': {len(self.tasks)} tasks, "
            f"{len(self.chains)} chains, {len(self.channels)} channels "
            f"(max parallelism {self.max_parallelism} key groups)"
        ]
        for chain in self.chains:
            steps = [self.steps[s] for s in chain.step_ids]
            ops = " -> ".join(f"{s.kind.value} '{s.name}'" for s in steps)
            tasks = [t for t in self.tasks if t.chain == chain.id]
            lines.append(f"  chain {chain.id} x{chain.parallelism}: {ops}")
            lines.append(f"    tasks: {', '.join(t.task_id for t in tasks)}")
            lines.extend(f"    event time: {note}" for s in steps if (note := event_time_note(s)))
            if tasks and tasks[0].outputs:
                for out in tasks[0].outputs:
                    target = out.target_task_ids[0].partition("[")[0]
                    fan = len(out.channels)
                    n_back = sum(
                        self.channels[c].back_edge
                        for t in tasks
                        for o in t.outputs
                        if o is not None and o.target_task_ids == out.target_task_ids
                        for c in o.channels
                    )
                    back = (
                        f"  [back-edge: {n_back} of {fan * len(tasks)} channels logged in "
                        "checkpoints, never blocked]"
                        if n_back
                        else ""
                    )
                    lines.append(
                        f"    out: {out.partitioning.value} -> '{target}' "
                        f"({fan} channel{'s' if fan != 1 else ''} per subtask){back}"
                    )
        return "\n".join(lines)


def event_time_note(step: Step) -> str:
    """What ``step`` does with event time, for explain() ("" if nothing)."""
    args = step.args
    if step.kind is StepKind.ASSIGN_TIMESTAMPS:
        idle, drift = args["idle_timeout"], args.get("max_drift")
        aligned = (
            ""
            if drift is None
            else f"; the source pauses while more than {drift} ahead of the lowest aligned "
            "source (max_drift)"
        )
        return (
            f"'{step.name}' assigns timestamps and generates watermarks here (max_delay "
            f"{args['max_delay']}, {'no idleness' if idle is None else f'idle after {idle} s'}"
            f", per split); they go in band to every output channel{aligned}"
        )
    if step.kind.keyed and args.get("event_time") is True:
        return f"'{step.name}' fires on the watermark (min over its input channels)"
    return ""


def _chainable(graph: LogicalGraph, step: Step) -> bool:
    if step.kind is StepKind.SOURCE or len(step.inputs) != 1:
        return False
    edge = step.inputs[0]
    if edge.kind is EdgeKind.FEEDBACK:
        return False
    upstream = graph.step(edge.source)
    return (
        edge.partitioning is Partitioning.FORWARD
        and upstream.parallelism == step.parallelism
        and len(upstream.outputs) == 1
    )


def build_plan(
    graph: LogicalGraph, name: str, max_parallelism: int, chaining: bool = True
) -> JobPlan:
    """Fuse chains, assign tasks, and lay out channels. The graph must be validated."""
    assign_signatures(graph)
    chains: list[Chain] = []
    chain_of: dict[int, int] = {}
    for step in graph.topological_order():
        if chaining and _chainable(graph, step):
            c = chain_of[step.inputs[0].source]
            chains[c].step_ids.append(step.id)
        else:
            c = len(chains)
            chains.append(Chain(c, [step.id], step.parallelism, step.name))
        chain_of[step.id] = c

    tasks: list[TaskSpec] = []
    first_task: dict[int, int] = {}
    for chain in chains:
        first_task[chain.id] = len(tasks)
        for i in range(chain.parallelism):
            tasks.append(TaskSpec(len(tasks), chain.id, i, f"{chain.name}[{i}]"))

    channels: list[ChannelSpec] = []
    for chain in chains:
        tail = graph.step(chain.step_ids[-1])
        for edge in tail.outputs:
            target_chain = chains[chain_of[edge.target]]
            for s in range(chain.parallelism):
                src_task = tasks[first_task[chain.id] + s]
                targets = (
                    [s]
                    if edge.partitioning is Partitioning.FORWARD
                    else list(range(target_chain.parallelism))
                )
                ids: list[int] = []
                for d in targets:
                    dst_task = tasks[first_task[target_chain.id] + d]
                    spec = ChannelSpec(
                        len(channels),
                        edge.source,
                        edge.target,
                        src_task.index,
                        dst_task.index,
                        edge.partitioning,
                    )
                    channels.append(spec)
                    dst_task.inputs.append(spec.id)
                    ids.append(spec.id)
                src_task.outputs.append(
                    OutputSpec(
                        edge.partitioning,
                        edge.key_fn,
                        ids,
                        [tasks[first_task[target_chain.id] + d].task_id for d in targets],
                    )
                )
    sources = [
        t.index for t in tasks if graph.step(chains[t.chain].step_ids[0]).kind is StepKind.SOURCE
    ]
    back = find_back_edges(tasks, channels, sources)
    for spec in channels:
        if spec.id in back:
            spec.back_edge = True
            tasks[spec.target_task].back_edge_inputs.append(spec.id)
    return JobPlan(name, graph.steps, chains, tasks, channels, max_parallelism)


def find_back_edges(
    tasks: list[TaskSpec], channels: list[ChannelSpec], roots: list[int]
) -> set[int]:
    """The back-edge channels of the task graph.

    Depth-first search from the source tasks (``roots``, in plan order); a channel into a
    task on the DFS stack is a back-edge. The task graph without them is acyclic, which
    is what cyclic ABS needs (Carbone et al. 2015, §4.2): a task aligns on its other
    inputs, and the barrier on a back-edge can only come back after the task forwarded
    it. With a shuffled feedback edge some of its channels are tree edges (the head
    subtask they reach was first entered through them) and are aligned like any other.
    """
    out: dict[int, list[ChannelSpec]] = {t.index: [] for t in tasks}
    for spec in channels:
        out[spec.source_task].append(spec)
    on_stack: set[int] = set()
    done: set[int] = set()
    back: set[int] = set()
    for root in roots:
        if root in done:
            continue
        stack: list[tuple[int, int]] = [(root, 0)]  # (task, index of its next channel)
        on_stack.add(root)
        while stack:
            task, i = stack[-1]
            if i == len(out[task]):
                stack.pop()
                on_stack.discard(task)
                done.add(task)
                continue
            stack[-1] = (task, i + 1)
            spec = out[task][i]
            if spec.target_task in on_stack:
                back.add(spec.id)
            elif spec.target_task not in done:
                on_stack.add(spec.target_task)
                stack.append((spec.target_task, 0))
    return back
