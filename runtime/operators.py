"""Operators as they run inside a task: each turns a batch (list) into a batch.

The per-record path lives here: list comprehensions and tight loops over a batch,
no per-record objects. Keyed operators keep their state in a
``statebackend.keyed.KeyedStateBackend`` dict that is snapshotted per checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from channels.partitioners import key_group_for, key_group_range
from runtime.graph import Step, StepKind
from runtime.sinks import Sink, SinkContext
from statebackend.keyed import KeyedStateBackend

_MISSING = object()


class Operator:
    """One step of a chain in one subtask. Task-loop thread only.

    Lifecycle: open -> restore_state? -> process* / snapshot_state* /
    notify_checkpoint_complete* -> finish -> close.
    """

    keyed_state: KeyedStateBackend | None = None

    def __init__(self, step: Step) -> None:
        self.step = step
        self.name = step.name

    def process(self, batch: list[Any]) -> list[Any]:
        return batch

    def snapshot_state(self, checkpoint_id: int) -> Any:
        """The operator's own (non-keyed) state for checkpoint ``checkpoint_id``."""
        return None

    def restore_state(self, state: Any) -> None:
        pass

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        pass

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        pass

    def finish(self) -> None:
        pass

    def close(self) -> None:
        pass


class MapOperator(Operator):
    def __init__(self, step: Step) -> None:
        super().__init__(step)
        fn = step.fn
        self.process = lambda batch: [fn(r) for r in batch]  # type: ignore[method-assign]


class FlatMapOperator(Operator):
    def __init__(self, step: Step) -> None:
        super().__init__(step)
        fn = step.fn
        self.process = lambda batch: [x for r in batch for x in fn(r)]  # type: ignore[method-assign]


class FilterOperator(Operator):
    def __init__(self, step: Step) -> None:
        super().__init__(step)
        fn = step.fn
        self.process = lambda batch: [r for r in batch if fn(r)]  # type: ignore[method-assign]


class KeyedOperator(Operator):
    def __init__(self, step: Step, subtask: int, max_parallelism: int) -> None:
        super().__init__(step)
        assert step.key_fn is not None
        self.key_fn: Callable[[Any], Any] = step.key_fn
        self.keyed_state = KeyedStateBackend(
            step.name,
            max_parallelism,
            key_group_range(subtask, step.parallelism, max_parallelism),
            lambda key: key_group_for(key, max_parallelism),
        )


class ReduceOperator(KeyedOperator):
    def process(self, batch: list[Any]) -> list[Any]:
        assert self.keyed_state is not None
        state = self.keyed_state.value_state()
        key_fn, fn, get = self.key_fn, self.step.fn, state.get
        out: list[Any] = []
        append = out.append
        for r in batch:
            k = key_fn(r)
            prev = get(k, _MISSING)
            v = r if prev is _MISSING else fn(prev, r)
            state[k] = v
            append(v)
        return out


class AggregateOperator(KeyedOperator):
    def process(self, batch: list[Any]) -> list[Any]:
        assert self.keyed_state is not None
        state = self.keyed_state.value_state()
        key_fn, add, get = self.key_fn, self.step.fn, state.get
        initial = self.step.args["initial"]
        out: list[Any] = []
        append = out.append
        if callable(initial):
            for r in batch:
                k = key_fn(r)
                acc = get(k, _MISSING)
                acc = add(initial() if acc is _MISSING else acc, r)
                state[k] = acc
                append((k, acc))
        else:
            for r in batch:
                k = key_fn(r)
                acc = add(get(k, initial), r)
                state[k] = acc
                append((k, acc))
        return out


class KeyedStateHandle:
    """The ``state`` argument of a keyed ``process`` function, scoped to the current key."""

    __slots__ = ("_backend", "_key", "_values")

    def __init__(self, backend: KeyedStateBackend) -> None:
        self._backend = backend
        self._values = backend.value_state()
        self._key: Any = None

    @property
    def value(self) -> Any:
        return self._values.get(self._key)

    @value.setter
    def value(self, v: Any) -> None:
        if v is None:
            self._values.pop(self._key, None)
        else:
            self._values[self._key] = v

    def list(self, name: str) -> list[Any]:
        states = self._backend.list_state(name)
        lst = states.get(self._key)
        if lst is None:
            lst = states[self._key] = []
        return lst

    def map(self, name: str) -> dict[Any, Any]:
        states = self._backend.map_state(name)
        m = states.get(self._key)
        if m is None:
            m = states[self._key] = {}
        return m

    def clear(self) -> None:
        """Drop every state of the current key."""
        for kind in ("value", "list", "map"):
            for states in self._backend.states_of_kind(kind):
                states.pop(self._key, None)


class ProcessOperator(KeyedOperator):
    def __init__(self, step: Step, subtask: int, max_parallelism: int) -> None:
        super().__init__(step, subtask, max_parallelism)
        assert self.keyed_state is not None
        self.handle = KeyedStateHandle(self.keyed_state)

    def process(self, batch: list[Any]) -> list[Any]:
        key_fn, fn, handle = self.key_fn, self.step.fn, self.handle
        out: list[Any] = []
        extend = out.extend
        for r in batch:
            k = key_fn(r)
            handle._key = k
            emitted = fn(k, r, handle)
            if emitted is not None:
                extend(emitted)
        return out


class SinkOperator(Operator):
    def __init__(self, step: Step, ctx: SinkContext) -> None:
        super().__init__(step)
        self.sink: Sink = step.fn
        self.sink.open(ctx)
        write = self.sink.write_batch

        def process(batch: list[Any]) -> list[Any]:
            write(batch)
            return []

        self.process = process  # type: ignore[method-assign]

    def snapshot_state(self, checkpoint_id: int) -> Any:
        return self.sink.snapshot_state(checkpoint_id)

    def restore_state(self, state: Any) -> None:
        self.sink.restore_state(state)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.sink.notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self.sink.notify_checkpoint_aborted(checkpoint_id)

    def finish(self) -> None:
        self.sink.finish()

    def close(self) -> None:
        self.sink.close()


def build_operator(
    step: Step, subtask: int, max_parallelism: int, sink_ctx: SinkContext | None
) -> Operator:
    """The runtime operator of a (non-source) step."""
    kind = step.kind
    if kind is StepKind.MAP:
        return MapOperator(step)
    if kind is StepKind.FLAT_MAP:
        return FlatMapOperator(step)
    if kind is StepKind.FILTER:
        return FilterOperator(step)
    if kind is StepKind.UNION or kind is StepKind.ITERATE:
        return Operator(step)  # records pass through unchanged
    if kind is StepKind.REDUCE:
        return ReduceOperator(step, subtask, max_parallelism)
    if kind is StepKind.AGGREGATE:
        return AggregateOperator(step, subtask, max_parallelism)
    if kind is StepKind.PROCESS:
        return ProcessOperator(step, subtask, max_parallelism)
    if kind is StepKind.SINK:
        assert sink_ctx is not None
        return SinkOperator(step, sink_ctx)
    raise ValueError(f"no runtime operator for {step.describe()}")
