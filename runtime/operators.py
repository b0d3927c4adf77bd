"""Operators as they run inside a task: the operator protocol and its registry.

Every step of a chain (after a source) is an `Operator`. The protocol, in the order a
task calls it (task-loop thread only):

* ``open(ctx)`` — once, before anything else (sinks open their files here);
* ``restore_state(state)`` — only when restoring (and always for sinks);
* ``process(batch, side) -> records`` — the per-record path, once per batch; ``side``
  is the logical input the batch came from (0 unless the step has several inputs);
* ``on_watermark(wm) -> records`` — event time advanced to ``wm`` (never backwards);
* ``on_processing_time(now) -> records`` — called about every ``timer_interval``
  when the operator ``wants_processing_time``;
* ``snapshot_state(id)`` / ``notify_checkpoint_complete(id)`` /
  ``notify_checkpoint_aborted(id)`` — checkpoints (a task hears of a completed one only
  when an operator of its chain overrides ``notify_checkpoint_complete``, or when it is
  final or synchronous: `acts_on_completion`);
* ``finish() -> records`` — all input ended (before the final checkpoint);
* ``close()`` — graceful shutdown only.

``build_operator`` looks the step's kind up in the registry (``register``); event-time
operators (windows, joins, timers) live in their own modules and register there.
Keyed operators keep their state in a ``statebackend.keyed.KeyedStateBackend``.
"""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from channels.partitioners import (
    bytecode_match,
    fast_key_fn,
    is_identity,
    key_group_for,
    key_group_range,
)
from runtime.graph import Step, StepKind
from runtime.sinks import Sink, SinkContext
from runtime.watermarks import NO_WATERMARK
from statebackend.keyed import KeyedStateBackend

_MISSING = object()


KeyedStateFactory = Callable[[str, int, range, Callable[[object], int]], KeyedStateBackend]
"""``(operator, max parallelism, key groups, key group of) -> backend``."""


@dataclass(frozen=True, slots=True)
class OperatorContext:
    """Where an operator runs: its subtask, the job's key groups, its sink context."""

    subtask: int
    max_parallelism: int
    sink: SinkContext | None = None
    debug_drop_event_time: bool = False
    """Tests only: restore without timers and watermarks (the companion of exactly-once)."""
    keyed_state_factory: KeyedStateFactory | None = None
    """Builds a keyed operator's state backend (``JobConfig.state_backend``); None: the
    in-memory ``KeyedStateBackend``."""


class Operator:
    """One step of a chain in one subtask (see the module docstring for the protocol)."""

    keyed_state: KeyedStateBackend | None = None
    uses_event_time = False
    """Whether watermarks mean anything to it (it gets ``on_watermark`` calls)."""
    wants_processing_time = False
    """Whether it gets ``on_processing_time`` calls (processing-time timers, windows)."""
    tracks_changes = False
    """Whether every key it writes in keyed state goes into ``keyed_state.changed`` (or its
    value into ``written_values()``, ``epoch_values()`` or ``log_new()`` of its keyed
    state): its keyed state can then be checkpointed incrementally (``runtime.changelog``)."""

    def __init__(self, step: Step, ctx: OperatorContext) -> None:
        self.step = step
        self.name = step.name
        self.watermark = NO_WATERMARK

    def open(self, ctx: OperatorContext) -> None:
        pass

    # Records are the user's: an operator passes them to the step's functions and on,
    # never looking inside (``object``); the user API types them (runtime.api.dataflow).
    def process(self, batch: list[object], side: int = 0) -> list[object]:
        return batch

    def on_watermark(self, watermark: float) -> list[object]:
        self.watermark = watermark
        return []

    def on_processing_time(self, now: float) -> list[object]:
        return []

    def snapshot_state(self, checkpoint_id: int) -> object:
        """The operator's own (non-keyed) state for checkpoint ``checkpoint_id``."""
        return None

    def restore_state(self, state: Any) -> None:
        """``state``: what ``snapshot_state`` returned, as msgpack gives it back (each
        operator reads its own shape)."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        pass

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """The job manager aborted ``checkpoint_id``: what its snapshot covered will not
        be committed by it (a later checkpoint's complete covers it)."""

    def finish(self) -> list[object]:
        return []

    def close(self) -> None:
        pass

    def after_keyed_restore(self) -> None:
        """The keyed state was restored (before ``restore_state``): rebuild indexes."""


OperatorFactory = Callable[[Step, OperatorContext], Operator]
OPERATOR_MODULES = (
    "runtime.event_time",
    "runtime.keyed_process",
    "runtime.windows",
    "runtime.joins",
    "runtime.superstep",
)
"""Modules whose operators register themselves (imported by ``build_operator``)."""
_REGISTRY: dict[StepKind, OperatorFactory] = {}


def register(*kinds: StepKind) -> Callable[[OperatorFactory], OperatorFactory]:
    """Class decorator: the runtime operator of steps of ``kinds``."""

    def add(factory: OperatorFactory) -> OperatorFactory:
        for kind in kinds:
            _REGISTRY[kind] = factory
        return factory

    return add


register(StepKind.UNION, StepKind.ITERATE)(Operator)  # records pass through unchanged


@register(StepKind.MAP)
class MapOperator(Operator):
    def __init__(self, step: Step, ctx: OperatorContext) -> None:
        super().__init__(step, ctx)
        fn = step.fn
        self.process = lambda batch, side=0: [fn(r) for r in batch]  # type: ignore[method-assign]


@register(StepKind.FLAT_MAP)
class FlatMapOperator(Operator):
    def __init__(self, step: Step, ctx: OperatorContext) -> None:
        super().__init__(step, ctx)
        fn = step.fn
        self.process = lambda batch, side=0: [x for r in batch for x in fn(r)]  # type: ignore[method-assign]


@register(StepKind.FILTER)
class FilterOperator(Operator):
    def __init__(self, step: Step, ctx: OperatorContext) -> None:
        super().__init__(step, ctx)
        fn = step.fn
        self.process = lambda batch, side=0: [r for r in batch if fn(r)]  # type: ignore[method-assign]


class KeyedOperator(Operator):
    def __init__(self, step: Step, ctx: OperatorContext) -> None:
        super().__init__(step, ctx)
        assert step.key_fn is not None
        self.key_fn: Callable[[object], object] = fast_key_fn(step.key_fn)  # r[c]: itemgetter
        # The record is its own key (key_by(lambda w: w)): no key_fn call per record.
        self.key_is_record = is_identity(step.key_fn)
        n = ctx.max_parallelism
        factory = ctx.keyed_state_factory or KeyedStateBackend
        self.keyed_state = factory(
            step.name,
            n,
            key_group_range(ctx.subtask, step.parallelism, n),
            lambda key: key_group_for(key, n),
        )


@register(StepKind.REDUCE)
class ReduceOperator(KeyedOperator):
    tracks_changes = True

    def process(self, batch: list[object], side: int = 0) -> list[object]:
        keyed = self.keyed_state
        assert keyed is not None
        fn = self.step.fn
        out: list[object] = []
        append = out.append
        keys = batch if self.key_is_record else list(map(self.key_fn, batch))
        epoch = keyed.epoch_values("value", _MISSING)
        if epoch is not None:  # this epoch's values apart (hot keys): nothing else tracks
            keyed.written_records += len(batch)
            for k, r in zip(keys, batch, strict=True):
                prev = epoch[k]
                v = r if prev is _MISSING else fn(prev, r)
                epoch[k] = v
                append(v)
            return out
        state = keyed.value_state()
        get = state.get
        written = keyed.written_values()
        before = 0 if written is None else len(state)  # (a store's len() is a scan)
        for k, r in zip(keys, batch, strict=True):
            prev = get(k, _MISSING)
            v = r if prev is _MISSING else fn(prev, r)
            state[k] = v
            append(v)
        if written is not None:
            _track(keyed, written, len(state) - before, batch, lambda: zip(keys, out, strict=True))
        return out


def _track(
    keyed: KeyedStateBackend,
    written: dict[object, object],
    added: int,
    batch: list[object],
    pairs: Callable[[], Iterable[tuple[object, object]]],
) -> None:
    """After a batch written into the live dict, with changes tracked (``written``: the
    delta's written values; ``added``: the keys the batch added to the state): its
    (key, value) ``pairs`` go into the written values, one update per batch, or, when
    every record added a new key, into the log of new keys (`KeyedStateBackend.log_new`:
    packed once, now)."""
    keyed.written_records += len(batch)
    if added == len(batch):
        logged = pairs()
        keyed.log_new(logged if type(logged) is list else list(logged))
    else:
        written.update(pairs())


def _plus_constant(acc: int, _record: object) -> int:  # the template of constant_addend
    return acc + 1


def constant_addend(fn: object) -> object:
    """``c`` when ``fn`` is a plain Python function of two parameters whose body is
    ``return <first parameter> + c`` with ``c`` a constant (the running count
    ``lambda n, _r: n + 1``, ``def add(acc, r): return acc + 10``), else ``_MISSING``:
    the aggregate then computes ``acc + c`` itself, the same operation on the same
    operands, without a Python call per record. Decided from the bytecode
    (``channels.partitioners.bytecode_match``), so only functions that can do nothing
    else qualify."""
    code = bytecode_match(fn, _plus_constant)
    return _MISSING if code is None else code.co_consts[1]


class _Total:
    """A running total that is not an int (restored from state another function wrote):
    ``next`` adds the addend, like ``itertools.count`` does for ints."""

    __slots__ = ("acc", "addend")

    def __init__(self, acc: Any, addend: int) -> None:
        self.acc, self.addend = acc, addend

    def __next__(self) -> Any:
        self.acc = self.acc + self.addend
        return self.acc


MIN_RECORDS_PER_KEY = 32
"""Running totals pay ~0.3-0.6 µs per key they hold at every snapshot (written back, then
a Python call to start the key again) and save ~20 ns a record: an epoch with fewer
records per key than this turns them off for the operator (Python's loop again)."""


class _RunningTotals(dict[object, "itertools.count[int] | _Total"]):
    """An int aggregate's totals of the keys it met since its last snapshot, each an
    ``itertools.count`` that goes on from the key's value in keyed state, so that
    ``next(totals[key])`` is ``acc + c`` computed in C: a batch runs through ``map`` and
    ``zip`` without a Python step per record. ``flush`` writes them back (the keyed state
    runs it before every snapshot: ``KeyedStateBackend.add_write_back``) and, after an
    epoch of fewer than ``MIN_RECORDS_PER_KEY`` records a key, turns them off
    (``enabled``): with many keys and few records each they would cost more than they
    save."""

    __slots__ = ("addend", "enabled", "initial", "keyed", "records", "state")

    def __init__(
        self, state: dict[Any, Any], initial: int, addend: int, keyed: KeyedStateBackend
    ) -> None:
        super().__init__()
        self.state, self.initial, self.addend = state, initial, addend
        self.keyed = keyed  # the flushed keys join its changed keys
        self.enabled = True
        self.records = 0  # taken through the totals since the last flush

    def __missing__(self, key: object) -> itertools.count[int] | _Total:
        acc = self.state.get(key, self.initial)
        total: itertools.count[int] | _Total = (
            itertools.count(acc + self.addend, self.addend)
            if type(acc) is int
            else _Total(acc, self.addend)
        )
        self[key] = total
        return total

    def flush(self) -> None:
        """Write every total to keyed state (a count's next value less the addend: exact
        on ints) and forget them."""
        if self and self.records < MIN_RECORDS_PER_KEY * len(self):
            self.enabled = False
        addend = self.addend
        values = [t.acc if type(t) is _Total else next(t) - addend for t in self.values()]
        self.state.update(zip(self, values, strict=True))
        written = self.keyed.written_values()
        if written is not None:
            written.update(zip(self, values, strict=True))
        self.clear()
        self.records = 0


@register(StepKind.AGGREGATE)
class AggregateOperator(KeyedOperator):
    tracks_changes = True

    def __init__(self, step: Step, ctx: OperatorContext) -> None:
        super().__init__(step, ctx)
        self.addend = constant_addend(step.fn)
        initial = step.args["initial"]
        self.totals: _RunningTotals | None = None
        keyed = self.keyed_state
        assert keyed is not None
        # acc + c on ints: in C (in memory only: the totals hold every key of an epoch)
        if type(self.addend) is int and type(initial) is int and keyed.in_memory:
            self.totals = _RunningTotals(keyed.value_state(), initial, self.addend, keyed)
            keyed.add_write_back(self.totals.flush)

    def after_keyed_restore(self) -> None:
        if self.totals is not None:
            self.totals.clear()

    def process(self, batch: list[object], side: int = 0) -> list[object]:
        totals = self.totals
        if totals is not None and totals.enabled:
            keys = batch if self.key_is_record else list(map(self.key_fn, batch))
            totals.records += len(keys)
            return list(zip(keys, map(next, map(totals.__getitem__, keys)), strict=True))
        keyed = self.keyed_state
        assert keyed is not None
        initial = self.step.args["initial"]
        epoch = keyed.epoch_values("value", _MISSING if callable(initial) else initial)
        if epoch is not None:  # this epoch's values apart (hot keys): nothing else tracks
            keyed.written_records += len(batch)
            return self._accumulate(batch, epoch, initial, None)
        state = keyed.value_state()
        written = keyed.written_values()
        before = 0 if written is None else len(state)  # (a store's len() is a scan)
        out = self._accumulate(batch, state, initial, state.get)
        if written is not None:
            _track(keyed, written, len(state) - before, batch, lambda: out)
        return out

    def _accumulate(
        self,
        batch: list[object],
        target: dict[Any, Any],
        initial: Any,
        get: Callable[[object, object], Any] | None,
    ) -> list[Any]:
        """Fold ``batch`` into the accumulators in ``target``: an `EpochValues` (``get``
        None: ``target[key]`` reads the epoch, then the live dict, else its default), or
        the live dict (read with its ``get``). The output: the (key, accumulator) pairs."""
        key_fn, add, addend = self.key_fn, self.step.fn, self.addend
        keys = batch if self.key_is_record else list(map(key_fn, batch))
        out: list[Any] = []
        append = out.append
        if callable(initial):  # a new key's accumulator is initial()
            for k, r in zip(keys, batch, strict=True):
                acc = target[k] if get is None else get(k, _MISSING)
                acc = add(initial() if acc is _MISSING else acc, r)
                target[k] = acc
                append((k, acc))
        elif get is None:  # the epoch's values apart: read with a subscript
            if addend is not _MISSING:  # acc + c: no call per record
                for k in keys:
                    acc = target[k] + addend
                    target[k] = acc
                    append((k, acc))
            else:
                for k, r in zip(keys, batch, strict=True):
                    acc = add(target[k], r)
                    target[k] = acc
                    append((k, acc))
        elif addend is not _MISSING:
            for k in keys:
                acc = get(k, initial) + addend
                target[k] = acc
                append((k, acc))
        else:
            for k, r in zip(keys, batch, strict=True):
                acc = add(get(k, initial), r)
                target[k] = acc
                append((k, acc))
        return out


@register(StepKind.SINK)
class SinkOperator(Operator):
    """A sink: ``snapshot_state`` is its pre-commit, ``notify_checkpoint_complete`` its
    commit, ``notify_checkpoint_aborted`` tells it a pre-commit will not be committed
    by that checkpoint, ``restore_state`` recovers (rolls back what no checkpoint covers)."""

    def __init__(self, step: Step, ctx: OperatorContext) -> None:
        super().__init__(step, ctx)
        self.sink: Sink = step.fn
        write = self.sink.write_batch

        def process(batch: list[object], side: int = 0) -> list[object]:
            write(batch)
            return []

        self.process = process  # type: ignore[method-assign]

    def open(self, ctx: OperatorContext) -> None:
        assert ctx.sink is not None
        self.sink.open(ctx.sink)

    def snapshot_state(self, checkpoint_id: int) -> object:
        return self.sink.snapshot_state(checkpoint_id)

    def restore_state(self, state: Any) -> None:
        self.sink.restore_state(state)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.sink.notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        aborted = getattr(self.sink, "notify_checkpoint_aborted", None)
        if aborted is not None:
            aborted(checkpoint_id)

    def finish(self) -> list[object]:
        self.sink.finish()
        return []

    def close(self) -> None:
        self.sink.close()


def _factory(step: Step) -> OperatorFactory | None:
    """The registered runtime operator of ``step``'s kind, if any."""
    for module in OPERATOR_MODULES:  # they register their operators when imported
        importlib.import_module(module)
    return _REGISTRY.get(step.kind)


def acts_on_completion(step: Step) -> bool:
    """Whether the runtime operator of ``step`` does anything on
    ``notify_checkpoint_complete`` (its class overrides the no-op: sinks commit there).
    The job manager tells a task that a checkpoint completed only when one of its steps
    does (and every task of a final or synchronous checkpoint: they end, or resume, on it):
    at short intervals the others would each spend a wake-up and a message per checkpoint
    on nothing."""
    notify = getattr(_factory(step), "notify_checkpoint_complete", None)
    return notify is not None and notify is not Operator.notify_checkpoint_complete


def build_operator(
    step: Step,
    subtask: int,
    max_parallelism: int,
    sink_ctx: SinkContext | None = None,
    debug_drop_event_time: bool = False,
    keyed_state_factory: KeyedStateFactory | None = None,
) -> Operator:
    """The runtime operator of a (non-source) step, from the registry; not opened yet."""
    factory = _factory(step)
    if factory is None:
        raise ValueError(f"no runtime operator for {step.describe()}")
    ctx = OperatorContext(
        subtask, max_parallelism, sink_ctx, debug_drop_event_time, keyed_state_factory
    )
    return factory(step, ctx)
