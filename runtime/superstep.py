"""Superstep iterations on the streaming task: the loop head's operator and protocol.

An iteration (``runtime.api.iterations``) is a Dataflow with a loop::

    source --hash by key--> ITERATE --forward, chained--> SUPERSTEP --> result (a sink)
                              ^                               |
                              +--- feedback, hash by target --+

`SuperstepOperator` (registered for ``StepKind.SUPERSTEP``) holds its key groups of the
solution set, the side input and (delta iterations) the workset in keyed state, so they
are snapshotted, restored and rescaled like any keyed state. Records reach it from its
loop head: the entry's ``(key, tag, payload)`` triples while the input loads (``tag``
says solution value, side input or workset), then ``(target key, message)`` pairs on
the feedback edge. A batch comes from one channel, so it is one or the other.

`SuperstepHead` is the task's side of the protocol with the job manager:

1. ``SuperstepGo(k)``: the operator computes superstep k's messages (combined per
   target), they go out on the feedback edge, then the marker of k on every feedback
   channel, in band behind them;
2. messages are absorbed into the inbox as they arrive (the feedback gate is drained
   and spills past ``spill_threshold`` like any loop head's);
3. `SuperstepAligner`: once the marker of k came on every feedback channel, the keys
   update from their inboxes and the head reports ``SuperstepDone(k)``;
4. the job manager decides on the control plane (next superstep, a checkpoint at the
   boundary, or ``EmitSolution``: the keys' values go out on the result edge).

At a superstep boundary every channel is empty and the inbox too, so a checkpoint
triggered there holds exactly the keyed state. The keyed state changes only in a head's
update, so a head's snapshot holds the state after superstep k whenever it is taken
between its update of k and that of k + 1, and its back-edge log is empty whenever its
barrier goes out before its messages of k + 1. The three checkpoint styles keep to that:

* blocking: the job manager triggers at the boundary, after every head's update of k,
  and sends ``SuperstepGo(k + 1)`` once the checkpoint completed;
* head: it triggers at the boundary and sends ``SuperstepGo(k + 1, snapshot_before=n)``
  at once: the head starts k + 1 only once it took snapshot n, the write overlaps k + 1;
* tail: ``SuperstepGo(k, snapshot_after=n)`` announces it, the job manager triggers n
  when the first head reported k done (so every head read the announcement: its markers
  of k are out), and each head holds barrier n until its own update of k ended, then
  snapshots and starts writing while the slower heads still update.

Threading: task-loop thread only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from channels.messages import Barrier, SuperstepMarker, decode_records, encode_data
from runtime import control as P
from runtime.barriers.superstep import SuperstepAligner
from runtime.errors import IterationError, OperatorFailure
from runtime.graph import Step, StepKind
from runtime.operators import KeyedOperator, OperatorContext, register
from runtime.task_outputs import TaskOutputs
from statebackend.metadata import TaskStateHandle

__all__ = [
    "SIDE",
    "SIDE_ITEM",
    "SOLUTION",
    "WORKSET",
    "SuperstepHead",
    "SuperstepOperator",
    "entry_key",
]

SOLUTION, SIDE, WORKSET, SIDE_ITEM = 0, 1, 2, 3
"""Tags of the entry's ``(key, tag, payload)`` records (``runtime.superstep_entry``):
a key's solution value, its side value, its workset membership, one item of its side
value (the items of a key are collected into a tuple before the first superstep)."""
_MISSING = object()


def entry_key(record: Any) -> Any:
    """The key of an entry record or a message: its first field."""
    return record[0]


@register(StepKind.SUPERSTEP)
class SuperstepOperator(KeyedOperator):
    """One subtask's key groups of an iteration. ``step.fn`` is the user's step object
    (``runtime.api.iterations.Step``: ``messages``, ``combine``, ``contribution``,
    ``update``, ``aggregate``); ``step.args["delta"]``: a delta iteration (only workset
    keys send; keys whose value changed form the next workset)."""

    def __init__(self, step: Step, ctx: OperatorContext) -> None:
        super().__init__(step, ctx)
        self.logic = step.fn
        self.delta: bool = bool(step.args["delta"])
        self.iteration: str = step.args.get("iteration", step.name)
        keyed = self.keyed_state
        assert keyed is not None
        # Declared now: the live dicts stay the same objects across a restore.
        self.solution = keyed.value_state("solution")
        self.side = keyed.value_state("side")
        self.workset = keyed.value_state("workset")
        self.side_items = keyed.list_state("side_items")
        """Grouped side input while it loads; folded into ``side`` by check_loaded."""
        self.inbox: dict[Any, Any] = {}
        self.received = 0
        """Messages absorbed since the last update (all of the current superstep's)."""
        self.kept: frozenset[Any] | None = None
        """Restored from a rescue snapshot (optimistic recovery): the keys restored, whose
        values and workset entries the input does not overwrite (`keep_restored`)."""

    # -- the per-record path -------------------------------------------------------------
    def process(self, batch: list[Any], side: int = 0) -> list[Any]:
        if batch and len(batch[0]) == 3:
            self._load(batch)
        else:
            self._absorb(batch)
        return []

    def _load(self, batch: list[Any]) -> None:
        solution, side_input, workset = self.solution, self.side, self.workset
        kept = self.kept
        if kept is not None:  # restored from a rescue: keep what survived, take the rest
            batch = [r for r in batch if r[0] not in kept and r[1] != WORKSET]
        side_items = self.side_items
        for key, tag, payload in batch:
            if tag == SOLUTION:
                if key in solution:
                    self._twice("solution", key, "a key has one initial value")
                solution[key] = payload
            elif tag == SIDE_ITEM:
                items = side_items.get(key)
                if items is None:
                    side_items[key] = [payload]
                else:
                    items.append(payload)
            elif tag == SIDE:
                if key in side_input:
                    self._twice(
                        "side input",
                        key,
                        "pass group_side=True to collect a key's side values into a tuple",
                    )
                side_input[key] = payload
            else:
                workset[key] = True

    def _twice(self, what: str, key: Any, fix: str) -> None:
        raise IterationError(
            f"iteration '{self.iteration}': its {what} holds key {key!r} twice; {fix}"
        )

    def _absorb(self, batch: list[Any]) -> None:
        inbox, solution, combine = self.inbox, self.solution, self.logic.combine
        for key, msg in batch:
            if key not in solution:
                raise IterationError(
                    f"step '{self.logic.name}' of iteration '{self.name}' sent a message to "
                    f"key {key!r}, which the solution set does not have: a step may not "
                    "change the key set (add the key to the initial data set)"
                )
            if key in inbox:
                inbox[key] = combine(inbox[key], msg) if combine else inbox[key] + list(msg)
            else:
                inbox[key] = msg if combine else list(msg)
        self.received += len(batch)

    # -- supersteps ----------------------------------------------------------------------
    def check_loaded(self) -> None:
        """Before the first superstep: a grouped side input is folded into one tuple per
        key; every workset and side key has a solution value."""
        if self.side_items:
            for key, items in self.side_items.items():
                self.side[key] = tuple(items)
            self.side_items.clear()
        for name, keys in (("workset", self.workset), ("side input", self.side)):
            unknown = [k for k in keys if k not in self.solution]
            if unknown:
                raise IterationError(
                    f"iteration '{self.name}': the {name} holds keys the solution set does "
                    f"not have, e.g. {sorted(map(repr, unknown))[:3]}"
                )

    def start(self) -> tuple[list[tuple[Any, Any]], float]:
        """This superstep's messages ``(target, message)`` (combined per target), and
        this subtask's contribution to the superstep's global sum."""
        logic, solution, side = self.logic, self.solution, self.side
        combine, messages, contribute = logic.combine, logic.messages, logic.contribution
        keys = self.workset if self.delta else solution
        out: dict[Any, Any] = {}
        contribution = 0.0
        for key in keys:
            value = solution[key]
            s = side.get(key)
            contribution += contribute(key, value, s)
            for target, msg in messages(key, value, s):
                if combine is not None:
                    prev = out.get(target, _MISSING)
                    out[target] = msg if prev is _MISSING else combine(prev, msg)
                elif target in out:
                    out[target].append(msg)
                else:
                    out[target] = [msg]
        return list(out.items()), contribution

    def end(self, total: float) -> tuple[float, int, int]:
        """Update every key from its inbox (bulk), or the keys that got messages (delta);
        returns ``(aggregate, active keys, messages received)``."""
        logic, solution, side, inbox = self.logic, self.solution, self.side, self.inbox
        update = logic.update
        received, self.received, self.inbox = self.received, 0, {}
        if not self.delta:
            aggregate_of = logic.aggregate
            aggregate = 0.0
            for key, value in solution.items():  # values change in place, not the key set
                new = update(key, value, inbox.get(key), side.get(key), total)
                aggregate += aggregate_of(key, value, new)
                solution[key] = new
            return aggregate, len(solution), received
        changed: dict[Any, Any] = {}
        for key, msgs in inbox.items():
            new = update(key, solution[key], msgs, side.get(key), total)
            if new is not None:
                changed[key] = new
        solution.update(changed)
        self.workset.clear()
        self.workset.update(dict.fromkeys(changed, True))
        return float(len(changed)), len(changed), received

    def solution_records(self) -> list[tuple[Any, Any]]:
        return list(self.solution.items())

    # -- optimistic recovery (restored from a rescue snapshot) ----------------------------
    def keep_restored(self) -> None:
        """This subtask restored a rescue snapshot: the keys it holds now survived (with
        their side input and workset entries); while the input loads again, it takes only
        the keys it lacks (the lost key groups': their side input, and a solution value
        the compensation replaces). The input's workset is not taken: the compensation
        says which keys join it."""
        self.kept = frozenset(self.solution)

    def compensation_input(self) -> tuple[list[tuple[Any, Any]], list[tuple[Any, Any]]]:
        """``(restored keys with their values, lost keys with their side input)``."""
        kept = self.kept or frozenset()
        solution, side = self.solution, self.side
        surviving = [(k, solution[k]) for k in kept]
        lost = [(k, side.get(k)) for k in solution if k not in kept]
        return surviving, lost

    def compensate(self, values: list[tuple[Any, Any]], workset: list[Any]) -> int:
        """Set the lost keys this subtask holds to their compensated ``values`` and add the
        keys it holds of ``workset`` to its workset (delta); the lost keys set."""
        kept, solution = self.kept or frozenset(), self.solution
        mine = [(k, v) for k, v in values if k in solution and k not in kept]
        solution.update(mine)
        if self.delta:
            self.workset.update(dict.fromkeys((k for k in workset if k in solution), True))
        self.kept = None  # from now on an ordinary head
        return len(mine)


class SuperstepHead:
    """The superstep protocol of one iteration task (see the module docstring): acts on
    the job manager's ``SuperstepGo`` / ``EmitSolution`` and on markers from the input
    side; reports ``SuperstepDone`` / ``SolutionEmitted``."""

    def __init__(
        self,
        operator: SuperstepOperator,
        task_index: int,
        attempt: int,
        outputs: TaskOutputs,
        feedback_edge: int,
        result_edge: int,
        feedback_channels: list[int],
        send: Callable[[P.Message], None],
        deliver: Callable[[int, Barrier], None] = lambda _c, _b: None,
        snapshots_taken: Callable[[], int] = lambda: 0,
    ) -> None:
        """``deliver(channel, barrier)``: hand a barrier on to the task's barrier handler;
        ``snapshots_taken()``: the newest checkpoint id the handler triggered or aborted."""
        self.operator, self.outputs = operator, outputs
        self.task_index, self.attempt = task_index, attempt
        self.feedback_edge, self.result_edge = feedback_edge, result_edge
        self.send = send
        self.aligner = SuperstepAligner(feedback_channels, self._aligned)
        self.checked = False
        self._sent = 0
        self._started_at = 0.0
        self._deliver, self._snapshots_taken = deliver, snapshots_taken
        self.updated: int | None = None
        """The newest superstep whose update ended here (in this attempt)."""
        self._tail: tuple[int, int] | None = None  # (checkpoint, superstep) announced
        self.held: list[tuple[int, Barrier]] = []
        """Barriers of the tail checkpoint, held until this head's update ends."""
        self.deferred: P.SuperstepGo | None = None
        """A Go that waits for this head's snapshot (head checkpoints)."""

    def on_go(self, msg: P.SuperstepGo) -> None:
        """The job manager's ``SuperstepGo``: start now, or once snapshot
        ``msg.snapshot_before`` was taken here."""
        if msg.snapshot_after is not None:
            self._tail = (msg.snapshot_after, msg.superstep)
        before = msg.snapshot_before
        if before is not None and self._snapshots_taken() < before:
            self.deferred = msg
            return
        self.go(msg.superstep)

    def on_barrier(self, channel: int, barrier: Barrier) -> None:
        """A barrier from the input side: held while it is the tail checkpoint's and this
        head's update of its superstep has not ended; else handed on."""
        tail = self._tail
        if (
            tail is not None
            and barrier.checkpoint_id == tail[0]
            and (self.updated is None or self.updated < tail[1])
        ):
            self.held.append((channel, barrier))
            return
        self._deliver(channel, barrier)
        self._resume()

    def aborted(self, checkpoint_id: int) -> None:
        """The job manager aborted ``checkpoint_id``: no barrier of it is held, no Go waits
        for it."""
        if self._tail is not None and self._tail[0] == checkpoint_id:
            self._tail = None
            self.held = [(c, b) for c, b in self.held if b.checkpoint_id != checkpoint_id]
        go = self.deferred
        if go is not None and go.snapshot_before == checkpoint_id:
            self.deferred = None
            self.go(go.superstep)

    def _resume(self) -> None:
        go = self.deferred
        if go is not None and self._snapshots_taken() >= (go.snapshot_before or 0):
            self.deferred = None
            self.go(go.superstep)

    def _release(self) -> None:
        held, self.held = self.held, []
        for channel, barrier in held:
            self._deliver(channel, barrier)
        self._resume()

    def go(self, superstep: int) -> None:
        """Send superstep ``superstep``'s messages, then its marker on every feedback channel."""
        self._started_at = time.perf_counter()
        try:
            if not self.checked:
                self.operator.check_loaded()
                self.checked = True
            records, contribution = self.operator.start()
        except Exception as err:
            raise OperatorFailure(self.operator.name, err) from err
        self._sent = len(records)
        out = self.outputs
        out.emit_to(self.feedback_edge, records)
        out.send_event_on(self.feedback_edge, SuperstepMarker(superstep, contribution))
        self.aligner.go(superstep)

    def on_marker(self, channel: int, marker: SuperstepMarker) -> None:
        self.aligner.on_marker(channel, marker)

    def _aligned(self, superstep: int, total: float) -> None:
        try:
            aggregate, active, received = self.operator.end(total)
        except Exception as err:
            raise OperatorFailure(self.operator.name, err) from err
        self.updated = superstep
        if self.held:  # tail: snapshot now, before the boundary agreement
            self._release()
        self.send(
            P.SuperstepDone(
                self.task_index,
                self.attempt,
                superstep,
                aggregate,
                active,
                self._sent,
                received,
                time.perf_counter() - self._started_at,
            )
        )

    def emit_solution(self, superstep: int) -> None:
        """The iteration ended after ``superstep``: the keys' values go out on the result
        edge (before any later barrier: the final checkpoint commits them)."""
        records = self.operator.solution_records()
        self.outputs.emit_to(self.result_edge, records)
        self.outputs.flush()
        self.send(P.SolutionEmitted(self.task_index, self.attempt, superstep, len(records)))

    # -- optimistic recovery ------------------------------------------------------------
    def rescue(self, checkpoint_id: int, write: Callable[[int], TaskStateHandle | None]) -> None:
        """The attempt failed: ``write`` this task's state (its keyed state changes only at
        an update, between two turns of the task loop, so it is the state after
        ``self.updated``) as part of rescue snapshot ``checkpoint_id``; answer ``Rescued``."""
        handle = write(checkpoint_id)
        after = -1 if self.updated is None else self.updated  # on the wire: -1 for none
        self.send(P.Rescued(self.task_index, self.attempt, checkpoint_id, after, handle))

    def send_compensation_input(self) -> None:
        surviving, lost = self.operator.compensation_input()
        self.send(
            P.CompensationInput(
                self.task_index, self.attempt, encode_data(0, surviving), encode_data(0, lost)
            )
        )

    def compensate(self, msg: P.Compensate) -> None:
        values = decode_records(msg.values) if msg.values else []
        workset = decode_records(msg.workset) if msg.workset else []
        keys = self.operator.compensate(values, workset)
        self.send(P.Compensated(self.task_index, self.attempt, keys))
