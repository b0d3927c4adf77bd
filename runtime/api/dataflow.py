"""The user API: a ``Dataflow`` is a DAG object you build, inspect, validate and run.

    flow = Dataflow("wordcount", parallelism=2)
    (flow.source(GeneratorSource(lambda i: f"w{i % 10}", 1000))
         .map(lambda w: (w, 1))
         .key_by(lambda kv: kv[0])
         .reduce(lambda a, b: (a[0], a[1] + b[1]))
         .collect("counts"))
    result = flow.run()
    result.output("counts")

Records that cross tasks travel as msgpack: use None, bool, int, float, str,
bytes, tuples/lists and dicts (sequences arrive as tuples).

The streams are generic in their record type (and keyed streams in their key type), as
Flink's ``DataStream<T>``: a type checker infers ``Stream[str]`` from a source of
strings, ``Stream[tuple[str, int]]`` after ``.map(lambda w: (w, 1))``, and refuses a
function whose parameter does not fit the records. A source that does not declare its
record type (``class S(Source)``) gives a ``Stream[Any]``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Generic

from typing_extensions import TypeVar

from channels.partitioners import DEFAULT_MAX_PARALLELISM
from runtime.config import JobConfig
from runtime.errors import GraphError
from runtime.graph import (
    EdgeKind,
    LogicalGraph,
    Partitioning,
    Step,
    StepKind,
    check_callable,
    check_parallelism,
    check_picklable,
)
from runtime.graph_checks import check_mode_fits
from runtime.keyed_process import process_args
from runtime.plan import JobPlan, build_plan
from runtime.sinks import CollectSink, PrintSink, Sink
from runtime.sources import Source
from runtime.superstep import SIDE, SIDE_ITEM, SOLUTION, WORKSET, entry_key
from runtime.superstep_entry import EntryTag
from runtime.timestamps import check_assigner_args, check_assigner_position, check_event_time
from runtime.window_kinds import WindowKind
from runtime.windows import LATE, MAIN

if TYPE_CHECKING:
    from jobmanager.result import JobResult
    from runtime.keyed_process import KeyedStateHandle, ProcessContext

# The record and key types of a stream; unsaid (a bare ``Stream`` annotation, an
# undeclared source) they are any type, as a raw ``list`` is.
T = TypeVar("T", default=Any)
K = TypeVar("K", default=Any)
U = TypeVar("U")  # a function's output record
A = TypeVar("A")  # an accumulator
L = TypeVar("L", default=Any)  # the left and right records of connected streams
R = TypeVar("R", default=Any)


class Stream(Generic[T]):
    """The output of a step, records of type ``T``. ``partitioning`` applies to the edge
    into the next step."""

    def __init__(
        self, flow: Dataflow, step: Step, partitioning: Partitioning = Partitioning.FORWARD
    ) -> None:
        self.flow = flow
        self.step = step
        self.partitioning = partitioning

    # -- partitioning --------------------------------------------------------------
    def rebalance(self) -> Stream[T]:
        """Distribute records round robin over the next step's subtasks."""
        return Stream(self.flow, self.step, Partitioning.REBALANCE)

    def broadcast(self) -> Stream[T]:
        """Send every record to every subtask of the next step."""
        return Stream(self.flow, self.step, Partitioning.BROADCAST)

    def key_by(self, key_fn: Callable[[T], K], name: str | None = None) -> KeyedStream[T, K]:
        """Partition by ``key_fn(record)`` (a stable hash into key groups)."""
        label = name or f"key_by after '{self.step.name}'"
        check_callable(key_fn, label, "key function")
        check_picklable(key_fn, label, "key function")
        return KeyedStream(self.flow, self.step, key_fn)

    # -- stateless operators ---------------------------------------------------------
    def _then(
        self,
        kind: StepKind,
        fn: Callable[..., object] | Sink,
        name: str | None,
        parallelism: int | None,
        args: dict[str, object] | None = None,
        key_fn: Callable[[T], object] | None = None,
        partitioning: Partitioning | None = None,
    ) -> Step:
        flow = self.flow
        step_name = flow.graph.unique_name(name, kind.value)
        par = (
            check_parallelism(parallelism, step_name)
            if parallelism is not None
            else self.step.parallelism
        )
        if kind is not StepKind.SINK or not isinstance(fn, Sink):
            check_callable(fn, step_name)
        check_picklable(fn, step_name, "function" if kind is not StepKind.SINK else "sink")
        step = flow.graph.add_step(step_name, kind, par, fn=fn, args=args, key_fn=key_fn)
        flow.graph.connect(self.step, step, partitioning or self.partitioning, key_fn)
        return step

    def map(
        self, fn: Callable[[T], U], name: str | None = None, parallelism: int | None = None
    ) -> Stream[U]:
        """One output record ``fn(record)`` per input record."""
        return Stream(self.flow, self._then(StepKind.MAP, fn, name, parallelism))

    def flat_map(
        self,
        fn: Callable[[T], Iterable[U]],
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream[U]:
        """Zero or more output records per input record: the items of ``fn(record)``."""
        return Stream(self.flow, self._then(StepKind.FLAT_MAP, fn, name, parallelism))

    def filter(
        self, fn: Callable[[T], bool], name: str | None = None, parallelism: int | None = None
    ) -> Stream[T]:
        """Keep the records for which ``fn(record)`` is true."""
        return Stream(self.flow, self._then(StepKind.FILTER, fn, name, parallelism))

    def union(self, *others: Stream[T], name: str | None = None) -> Stream[T]:
        """Merge this stream with ``others`` (each input keeps its own partitioning)."""
        flow = self.flow
        step_name = flow.graph.unique_name(name, "union")
        if not others:
            raise GraphError(f"union '{step_name}' needs at least one other stream.")
        for other in others:
            if not isinstance(other, Stream) or isinstance(other, KeyedStream):
                raise GraphError(
                    f"union '{step_name}': can only union Streams, got {type(other).__name__}."
                )
            if other.flow is not flow:
                raise GraphError(
                    f"union '{step_name}': stream '{other.step.name}' belongs to another Dataflow."
                )
        step = flow.graph.add_step(step_name, StepKind.UNION, self.step.parallelism)
        for stream in (self, *others):
            flow.graph.connect(stream.step, step, stream.partitioning)
        return Stream(flow, step)

    def assign_timestamps(
        self,
        ts_fn: Callable[[T], float],
        max_delay: float = 0,
        idle_timeout: float | None = None,
        name: str | None = None,
        max_drift: float | None = None,
    ) -> Stream[T]:
        """Event time: ``ts_fn(record)`` is a record's timestamp (a number); watermarks
        trail the largest timestamp seen by ``max_delay`` (bounded out-of-orderness), per
        source subtask and split. A subtask or split that reads nothing for
        ``idle_timeout`` seconds stops holding the watermark back until it reads again.
        Call it on the stream a source returns (the step is fused into the source's task).

        ``max_drift`` aligns watermarks (Flink's watermark alignment): a source subtask
        whose watermark is more than ``max_drift`` ahead of the lowest watermark of the
        job's aligned sources (every ``assign_timestamps`` with a ``max_drift``; idle and
        ended ones do not count) stops reading until the others catch up, so windows and
        joins downstream do not hold the state of a subtask that ran ahead. The lowest
        watermark comes with the answers to the source's reports, every
        ``alignment_interval`` seconds.
        """
        flow = self.flow
        step_name = flow.graph.unique_name(name, "assign_timestamps")
        check_assigner_args(step_name, max_delay, idle_timeout, max_drift)
        args: dict[str, object] = {
            "max_delay": max_delay,
            "idle_timeout": idle_timeout,
            "max_drift": max_drift,
        }
        step = self._then(StepKind.ASSIGN_TIMESTAMPS, ts_fn, step_name, None, args)
        check_assigner_position(flow.graph, step)
        return Stream(flow, step)

    # -- loops ------------------------------------------------------------------------
    def iterate(self, name: str | None = None, parallelism: int | None = None) -> Loop[T]:
        """Open a loop whose entry is this stream (its partitioning applies).

        ``loop.stream`` is the loop body's input: the union of this stream and the
        feedback. Build the body from it, close the cycle with ``loop.feedback(s)``, and
        let records leave through ordinary operators (e.g. a ``filter`` into a sink)::

            loop = numbers.iterate(name="collatz")
            step = loop.stream.map(collatz_step)
            loop.feedback(step.filter(lambda r: r[1] != 1))
            step.filter(lambda r: r[1] == 1).collect("done")

        Checkpoints stay exactly-once: records in flight on the feedback edge are
        logged into the snapshot (cyclic ABS). A bounded job ends once every source
        ended and no record is left in any loop.
        """
        return Loop.open(self.flow, self.step, name, parallelism, self.partitioning, None)

    # -- sinks -------------------------------------------------------------------------
    def sink(self, sink: Sink, name: str | None = None, parallelism: int | None = None) -> None:
        """Write the stream to ``sink`` (see runtime.sinks)."""
        if not isinstance(sink, Sink):
            raise GraphError(
                f"sink(...) needs a runtime.sinks.Sink instance (e.g. FileSink, CollectSink), "
                f"got {type(sink).__name__}."
            )
        self._then(StepKind.SINK, sink, name or None, parallelism)

    def collect(self, name: str | None = None, parallelism: int | None = None) -> None:
        """Return the records from ``run()``: ``result.output(name)`` (exactly once)."""
        self.sink(CollectSink(), name=name or "collect", parallelism=parallelism)

    def print(self, prefix: str = "", name: str | None = None) -> None:
        """Print each record as it arrives."""
        self.sink(PrintSink(prefix), name=name or "print")


class Loop(Generic[T]):
    """An open loop: build its body from ``stream``, close it with ``feedback``."""

    def __init__(self, flow: Dataflow, head: Step) -> None:
        self.flow = flow
        self.head = head
        self.stream: Stream[T] = Stream(flow, head)
        """The loop body's input: the loop's entry stream and the feedback, merged."""

    @staticmethod
    def open(
        flow: Dataflow,
        entry: Step,
        name: str | None,
        parallelism: int | None,
        partitioning: Partitioning,
        key_fn: Callable[[T], object] | None,
    ) -> Loop[T]:
        step_name = flow.graph.unique_name(name, "iterate")
        par = (
            check_parallelism(parallelism, step_name)
            if parallelism is not None
            else entry.parallelism
        )
        head = flow.graph.add_step(step_name, StepKind.ITERATE, par)
        flow.graph.connect(entry, head, partitioning, key_fn)
        return Loop(flow, head)

    @property
    def name(self) -> str:
        return self.head.name

    def feedback(self, stream: Stream[T] | KeyedStream[T, object]) -> None:
        """Send ``stream`` (built from ``self.stream``) back into the loop head.

        Its partitioning applies to the feedback edge: ``s.key_by(f)`` or
        ``s.rebalance()`` spread records over the head's subtasks; a plain stream is
        forwarded subtask to subtask (equal parallelism needed).
        """
        graph = self.flow.graph
        if not isinstance(stream, Stream | KeyedStream):
            raise GraphError(
                f"loop '{self.name}': feedback(...) needs a stream, got {type(stream).__name__}."
            )
        if stream.flow is not self.flow:
            raise GraphError(
                f"loop '{self.name}': the feedback stream '{stream.step.name}' belongs to "
                "another Dataflow."
            )
        if graph.feedback_edge(self.head) is not None:
            closed = graph.step(graph.feedback_edge(self.head).source)  # type: ignore[union-attr]
            raise GraphError(
                f"loop '{self.name}' is already closed by feedback from '{closed.name}'; "
                "a loop has one feedback edge: union() the streams to send back first."
            )
        if stream.step.id not in graph.downstream(self.head):
            raise GraphError(
                f"loop '{self.name}': the feedback stream '{stream.step.name}' is not built "
                f"from loop.stream, so it cannot close this loop. Build it from "
                f"loop.stream (the loop body's input)."
            )
        if isinstance(stream, KeyedStream):
            partitioning, key_fn = Partitioning.HASH, stream.key_fn
        else:
            partitioning, key_fn = stream.partitioning, None
        graph.connect(stream.step, self.head, partitioning, key_fn, EdgeKind.FEEDBACK)

    def __repr__(self) -> str:
        return f"Loop({self.name!r})"


class KeyedStream(Generic[T, K]):
    """A stream of ``T`` partitioned by a key of type ``K``; its operators keep state per
    key (checkpointed)."""

    def __init__(self, flow: Dataflow, step: Step, key_fn: Callable[[T], K]) -> None:
        self.flow = flow
        self.step = step
        self.key_fn = key_fn

    def _keyed(
        self,
        kind: StepKind,
        fn: Callable[..., object],
        name: str | None,
        parallelism: int | None,
        args: dict[str, object] | None = None,
    ) -> Stream[Any]:
        """The keyed step; its caller says the output's record type."""
        upstream: Stream[T] = Stream(self.flow, self.step, Partitioning.HASH)
        step = upstream._then(kind, fn, name, parallelism, args, key_fn=self.key_fn)
        return Stream(self.flow, step)

    def iterate(self, name: str | None = None, parallelism: int | None = None) -> Loop[T]:
        """Open a loop whose entry is hash partitioned by this key (see Stream.iterate)."""
        return Loop.open(self.flow, self.step, name, parallelism, Partitioning.HASH, self.key_fn)

    def map(
        self, fn: Callable[[T], U], name: str | None = None, parallelism: int | None = None
    ) -> Stream[U]:
        """A stateless map after hash partitioning (records of one key reach one subtask)."""
        return self._keyed(StepKind.MAP, fn, name, parallelism)

    def flat_map(
        self,
        fn: Callable[[T], Iterable[U]],
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream[U]:
        return self._keyed(StepKind.FLAT_MAP, fn, name, parallelism)

    def filter(
        self, fn: Callable[[T], bool], name: str | None = None, parallelism: int | None = None
    ) -> Stream[T]:
        return self._keyed(StepKind.FILTER, fn, name, parallelism)

    def window(
        self,
        kind: WindowKind,
        name: str | None = None,
        allowed_lateness: float = 0,
        late_output: str | None = None,
        timestamp: Callable[[T], float] | None = None,
        parallelism: int | None = None,
    ) -> WindowedStream[T, K]:
        """Cut each key's records into windows (runtime.window_kinds); see WindowedStream."""
        return WindowedStream(
            self, kind, name, allowed_lateness, late_output, timestamp, parallelism
        )

    def connect(self, other: KeyedStream[R, K]) -> ConnectedStreams[T, R, K]:
        """Two keyed streams into one step (runtime.api.dataflow): process, joins."""
        return ConnectedStreams(self, other)

    def reduce(
        self, fn: Callable[[T, T], T], name: str | None = None, parallelism: int | None = None
    ) -> Stream[T]:
        """Running reduce per key: emits ``fn(previous, record)`` (the first record as is)."""
        return self._keyed(StepKind.REDUCE, fn, name, parallelism)

    def aggregate(
        self,
        initial: A | Callable[[], A],
        add: Callable[[A, T], A],
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream[tuple[K, A]]:
        """Running aggregate per key: ``acc = add(acc, record)`` starting from ``initial``
        (a value, or a zero-argument callable for mutable accumulators); emits ``(key, acc)``."""
        return self._keyed(StepKind.AGGREGATE, add, name, parallelism, {"initial": initial})

    def process(
        self,
        fn: Callable[[K, T, KeyedStateHandle], Iterable[U] | None]
        | Callable[[K, T, KeyedStateHandle, ProcessContext], Iterable[U] | None],
        name: str | None = None,
        parallelism: int | None = None,
        on_timer: Callable[[K, float, KeyedStateHandle, ProcessContext], Iterable[U] | None]
        | None = None,
        timestamp: Callable[[T], float] | None = None,
    ) -> Stream[U]:
        """General keyed function ``fn(key, record, state)`` returning records to emit (or None).

        ``state`` is scoped to the record's key: ``state.value`` (get/set, None if unset),
        ``state.list(name)``, ``state.map(name)`` (mutable, created empty), ``state.clear()``.
        With a fourth parameter, ``fn(key, record, state, ctx)`` also gets timers and
        event time (``runtime.keyed_process.ProcessContext``); ``on_timer(key, ts, state,
        ctx)`` is called once per timer. ``timestamp``: where a record's event timestamp
        is, when records were reshaped since ``assign_timestamps``.
        """
        args = process_args(fn, name or "process", on_timer, timestamp)
        return self._keyed(StepKind.PROCESS, fn, name, parallelism, args)


class Dataflow:
    """A named DAG of sources, operators and sinks, with its run settings.

    ``parallelism`` is the default for sources; other steps default to their input's.
    ``max_parallelism`` is the number of key groups (the most any keyed step can use,
    also after restoring at another parallelism). Checkpoint settings are described in
    ``runtime.config.JobConfig`` and can be passed here as keyword arguments.
    """

    def __init__(
        self,
        name: str = "dataflow",
        parallelism: int = 1,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
        chaining: bool = True,
        **config: object,
    ) -> None:
        self.name = name
        self.parallelism = check_parallelism(parallelism, name)
        if not isinstance(max_parallelism, int) or max_parallelism < 1:
            raise GraphError(f"max_parallelism must be a positive int, got {max_parallelism!r}.")
        self.max_parallelism = max_parallelism
        self.chaining = chaining
        self.graph = LogicalGraph()
        # replace() rejects unknown settings with a GraphError listing the known ones.
        self.config: JobConfig = JobConfig().replace(**config)

    def source(
        self, source: Source[T], name: str | None = None, parallelism: int | None = None
    ) -> Stream[T]:
        """Add a source (GeneratorSource, TextFileSource, CollectionSource or your own)."""
        if not isinstance(source, Source):
            raise GraphError(
                f"source(...) needs a runtime.sources.Source instance, got {type(source).__name__}."
            )
        step_name = self.graph.unique_name(name, source.name)
        par = check_parallelism(
            parallelism if parallelism is not None else self.parallelism, step_name
        )
        source.validate(step_name)
        check_picklable(source, step_name, "source")
        step = self.graph.add_step(step_name, StepKind.SOURCE, par, fn=source)
        return Stream(self, step)

    # -- iterations -------------------------------------------------------------------
    def bulk_iteration(
        self,
        name: str,
        *,
        solution: Stream | KeyedStream,
        step: Any,
        side: Stream | KeyedStream | None = None,
        group_side: bool = False,
        max_supersteps: int | None = None,
        converged: Callable[[float], bool] | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """A bulk superstep iteration (``runtime.superstep``); returns its result, a stream
        of ``(key, final value)`` for any sink (exactly once, like every sink).

        ``solution``: a stream of ``(key, initial value)`` pairs (each key once);
        ``side``: a stream of ``(key, side value)`` pairs, a static input every key sees
        in ``step.messages``/``update``; with ``group_side=True`` a key's values are
        collected into a tuple (an edge stream ``(source, target)`` gives every vertex
        its targets, like ``groupByKey``). ``step``: a ``runtime.iterations.Step``;
        every key sends its messages every superstep. The iteration ends after
        ``max_supersteps`` or once ``converged(sum of step.aggregate)`` holds. Every
        input may come from any source; all are hashed by key into the loop head::

            edges = flow.source(ParquetSource("edges/")).map(lambda r: (r["src"], r["dst"]))
            ranks = flow.source(ParquetSource("vertices/")).map(lambda r: (r["id"], 1 / n))
            result = flow.bulk_iteration("pagerank", solution=ranks, side=edges,
                                         group_side=True, step=PageRankStep(n),
                                         max_supersteps=100, converged=l1_below(n * 1e-9))
            result.sink(PostgresUpsertSink(dsn, "ranks", key_columns=["vertex"]))
        """
        where = f"iteration '{name}'"
        if max_supersteps is None and converged is None:
            raise GraphError(
                f"{where} can never end: a bulk iteration needs max_supersteps=, a "
                "converged= criterion (e.g. runtime.iterations.l1_below(eps)), or both."
            )
        if converged is not None:
            check_callable(converged, name, "converged criterion")
            check_picklable(converged, name, "converged criterion")
        inputs: list[tuple[str, Any, int, int | None]] = [("solution", solution, SOLUTION, None)]
        if side is not None:
            inputs.append(("side", side, SIDE_ITEM if group_side else SIDE, None))
        return _iteration(self, name, step, False, inputs, parallelism, max_supersteps, converged)

    def delta_iteration(
        self,
        name: str,
        *,
        solution: Stream | KeyedStream,
        step: Any,
        workset: Stream | KeyedStream | None = None,
        side: Stream | KeyedStream | None = None,
        group_side: bool = False,
        max_supersteps: int | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """A delta superstep iteration: only workset keys send; keys whose value changed
        (``step.update`` returned other than None) form the next workset; it ends when
        the workset is empty everywhere (or after ``max_supersteps``). ``workset``: a
        stream of keys (None: every solution key). Otherwise as ``bulk_iteration``."""
        inputs: list[tuple[str, Any, int, int | None]] = [
            ("solution", solution, SOLUTION, None if workset is not None else WORKSET)
        ]
        if side is not None:
            inputs.append(("side", side, SIDE_ITEM if group_side else SIDE, None))
        if workset is not None:
            inputs.append(("workset", workset, WORKSET, None))
        return _iteration(self, name, step, True, inputs, parallelism, max_supersteps, None)

    def validate(self, config: JobConfig | None = None) -> None:
        """Raise GraphError naming the first problem; called by explain() and run()."""
        self.graph.validate()
        check_event_time(self.graph)
        check_mode_fits(self.graph, config or self.config)
        for step in self.graph.steps:
            if step.kind is StepKind.SINK:
                step.fn.validate(step.name)  # offline; run_job calls check_system
        for step in self.graph.steps:
            if step.parallelism > self.max_parallelism and step.kind.keyed:
                raise GraphError(
                    f"keyed step '{step.name}' has parallelism {step.parallelism} > max_parallelism "
                    f"{self.max_parallelism}; raise Dataflow(max_parallelism=...)."
                )

    def plan(self, config: JobConfig | None = None) -> JobPlan:
        self.validate(config)
        return build_plan(self.graph, self.name, self.max_parallelism, self.chaining)

    def explain(self) -> str:
        """The physical plan (tasks, chains, channels) as text."""
        text = self.plan().explain()
        print(text)
        return text

    def run(
        self, restore_from: str | None = None, faults: Iterable[object] = (), **overrides: object
    ) -> JobResult:
        """Run to completion (bounded sources) on the active SparkSession or a local one.

        ``restore_from``: a checkpoint directory (``chk-<n>``) or a checkpoint root (its
        latest valid checkpoint). ``faults``: fault injections (jobmanager.faults).
        ``overrides``: JobConfig settings for this run only.
        """
        from jobmanager.runner import run_job

        config = self.config.replace(**overrides) if overrides else self.config
        return run_job(self.plan(config), config, restore_from=restore_from, faults=list(faults))


def _iteration(
    flow: Dataflow,
    name: str,
    step: Any,
    delta: bool,
    inputs: list[tuple[str, Any, int, int | None]],
    parallelism: int | None,
    max_supersteps: int | None,
    converged: Callable[[float], bool] | None,
) -> Stream:
    """The loop of an iteration (``runtime.superstep``)::

        input --tag--+--hash by key--> <name> (iterate) -> <step>:superstep --> result
        input --tag--+                     ^                        |
                                           +---- feedback, hash ----+

    Each input ``(what, stream, tag, also tag)`` is mapped to ``(key, tag, payload)``
    records (``EntryTag``, in the input's own task) and hashed by key into the loop
    head."""
    graph = flow.graph
    loop_name = graph.unique_name(name, "iteration")
    where = f"iteration '{loop_name}'"
    for method in ("messages", "update"):
        if not callable(getattr(step, method, None)):
            raise GraphError(
                f"{where}: step= must be a runtime.iterations.Step (with messages() and "
                f"update()), got {type(step).__name__} {step!r} without {method}()."
            )
    if max_supersteps is not None and (
        not isinstance(max_supersteps, int)
        or isinstance(max_supersteps, bool)
        or max_supersteps < 1
    ):
        raise GraphError(f"{where}: max_supersteps must be an int >= 1, got {max_supersteps!r}.")
    par = check_parallelism(parallelism if parallelism is not None else flow.parallelism, name)
    head_name = graph.unique_name(f"{getattr(step, 'name', 'step')}:superstep", "superstep")
    check_picklable(step, head_name, "step")
    tagged: list[Step] = []
    for what, stream, tag, also in inputs:
        if not isinstance(stream, Stream | KeyedStream):
            raise GraphError(
                f"{where}: its {what} input must be a Stream of this Dataflow (e.g. "
                f"flow.source(CollectionSource(pairs)) or a ParquetSource mapped to pairs), "
                f"got {type(stream).__name__}."
            )
        if stream.flow is not flow:
            raise GraphError(
                f"{where}: its {what} input '{stream.step.name}' belongs to another Dataflow."
            )
        fn = EntryTag(loop_name, what, tag, what != "workset", also)
        plain = Stream(flow, stream.step)  # the tag map runs in the input's own task
        tagged.append(plain._then(StepKind.FLAT_MAP, fn, f"{loop_name}:{what}", None))
    loop = Loop.open(flow, tagged[0], loop_name, par, Partitioning.HASH, entry_key)
    for step_in in tagged[1:]:
        graph.connect(step_in, loop.head, Partitioning.HASH, entry_key)
    args = {
        "delta": delta,
        "max_supersteps": max_supersteps,
        "converged": converged,
        "iteration": loop_name,
    }
    head = graph.add_step(head_name, StepKind.SUPERSTEP, par, fn=step, args=args, key_fn=entry_key)
    graph.connect(loop.head, head, Partitioning.FORWARD)
    graph.connect(head, loop.head, Partitioning.HASH, entry_key, EdgeKind.FEEDBACK)
    return Stream(flow, head)


# ----------------------------------------------------------------------------
# Connected streams
#
# The user API of two keyed streams in one step: ``left.connect(right)``.
#
#     orders.key_by(oid).connect(payments.key_by(oid)).interval_join(0, 600_000, name="paid")
#
# Both inputs must be keyed (``key_by``) and distinct steps; each keeps its own key
# function (equal key values meet in one subtask) and its own timestamp function
# (derived from its ``assign_timestamps``, or ``left_timestamp``/``right_timestamp``).
# ----------------------------------------------------------------------------


class ConnectedStreams(Generic[L, R, K]):
    """A left and a right keyed stream (records ``L`` and ``R``, one key type ``K``);
    finish with process, interval_join or window_join."""

    def __init__(self, left: KeyedStream[L, K], right: KeyedStream[R, K]) -> None:
        if not isinstance(right, KeyedStream):
            raise GraphError(
                f"connect after '{left.step.name}': a join of unkeyed streams; call "
                f".key_by(...) on both streams before connect (got {type(right).__name__})."
            )
        if right.flow is not left.flow:
            raise GraphError(f"connect: stream '{right.step.name}' belongs to another Dataflow.")
        if right.step is left.step:
            raise GraphError(
                f"connect: both sides come from step '{left.step.name}'; the step could not "
                "tell its sides apart. Put a map on one side first."
            )
        self.left, self.right = left, right

    def _build(
        self,
        kind: StepKind,
        fn: Callable[..., object] | None,
        name: str | None,
        parallelism: int | None,
        args: dict[str, object],
        stamps: tuple[Callable[[L], float] | None, Callable[[R], float] | None] = (None, None),
    ) -> Stream[Any]:
        """The two-input step; its caller says the output's record type."""
        left, right, graph = self.left, self.right, self.left.flow.graph
        step_name = graph.unique_name(name, kind.value)
        par = (
            check_parallelism(parallelism, step_name)
            if parallelism is not None
            else left.step.parallelism
        )
        for stamp in stamps:
            if stamp is not None:
                check_callable(stamp, step_name, "timestamp function")
        if fn is not None:
            check_picklable(fn, step_name, "function")
        args = {**args, "key_fns": [left.key_fn, right.key_fn], "timestamp_fns": list(stamps)}
        step = graph.add_step(step_name, kind, par, fn=fn, args=args, key_fn=left.key_fn)
        graph.connect(left.step, step, Partitioning.HASH, left.key_fn)
        graph.connect(right.step, step, Partitioning.HASH, right.key_fn)
        return Stream(left.flow, step)

    def process(
        self,
        fn: Callable[[K, L | R, int, KeyedStateHandle, ProcessContext], Iterable[U] | None],
        name: str | None = None,
        on_timer: Callable[[K, float, KeyedStateHandle, ProcessContext], Iterable[U] | None]
        | None = None,
        parallelism: int | None = None,
    ) -> Stream[U]:
        """``fn(key, record, side, state, ctx)`` (side 0 = left, 1 = right), timers and
        ``on_timer(key, ts, state, ctx)`` as in keyed ``process``; state is shared."""
        label = name or "co_process"
        check_callable(fn, label)
        args = process_args(lambda k, r, s, c: None, label, on_timer, None)
        args["with_ctx"] = True
        return self._build(StepKind.CO_PROCESS, fn, name, parallelism, args)

    def interval_join(
        self,
        lower: float,
        upper: float,
        name: str | None = None,
        left_timestamp: Callable[[L], float] | None = None,
        right_timestamp: Callable[[R], float] | None = None,
        parallelism: int | None = None,
    ) -> Stream[tuple[K, L, R]]:
        """``(key, left, right)`` for each pair with ``left.ts + lower <= right.ts <=
        left.ts + upper``; state is freed as the watermark passes."""
        label = name or "interval_join"
        for what, v in (("lower", lower), ("upper", upper)):
            if not isinstance(v, int | float) or isinstance(v, bool) or math_bad(v):
                raise GraphError(
                    f"step '{label}': {what} bound must be a finite number, got {v!r}."
                )
        if lower > upper:
            raise GraphError(
                f"step '{label}': lower bound {lower} is above upper bound {upper}; no pair "
                "could ever match."
            )
        args: dict[str, object] = {"lower": lower, "upper": upper, "event_time": True}
        stamps = (left_timestamp, right_timestamp)
        return self._build(StepKind.INTERVAL_JOIN, None, name, parallelism, args, stamps)

    def window_join(
        self,
        kind: WindowKind,
        name: str | None = None,
        left_timestamp: Callable[[L], float] | None = None,
        right_timestamp: Callable[[R], float] | None = None,
        parallelism: int | None = None,
    ) -> Stream[tuple[K, float, float, L, R]]:
        """``(key, start, end, left, right)`` for each pair in the same event-time window."""
        label = name or "window_join"
        if not isinstance(kind, WindowKind) or kind.merging or not kind.event_time:
            raise GraphError(
                f"step '{label}': window_join needs a Tumbling or Sliding window, got {kind!r}."
            )
        kind.check(label)
        args = {"kind": kind, "event_time": True}
        stamps = (left_timestamp, right_timestamp)
        return self._build(StepKind.WINDOW_JOIN, None, name, parallelism, args, stamps)


def math_bad(v: float) -> bool:
    return v != v or v in (float("inf"), float("-inf"))


# ----------------------------------------------------------------------------
# Windowed streams
#
# The user API of windows: ``keyed.window(kind, ...)`` then an aggregation.
#
#     w = clicks.key_by(user).window(Session(gap=30_000), allowed_lateness=10_000,
#                                    late_output="late_clicks", name="sessions")
#     per_session = w.aggregate(0, lambda n, _c: n + 1, merge=lambda a, b: a + b)
#     per_session.sink(...)          # (user, start, end, count)
#     w.late.sink(...)               # the records later than the allowed lateness
#
# A window step with a late output emits tagged records; two chained flat-map steps
# split them into the main stream and the named late stream.
# ----------------------------------------------------------------------------


def _main(record: tuple[int, object]) -> Iterable[object]:
    return (record[1],) if record[0] == MAIN else ()


def _late(record: tuple[int, U]) -> Iterable[U]:
    return (record[1],) if record[0] == LATE else ()


def _window_end(record: tuple[object, float, float, object]) -> float:
    return record[2]


class WindowedStream(Generic[T, K]):
    """A keyed stream cut into windows; finish it with ``aggregate``, ``reduce``,
    ``count`` or ``process`` (each returns a stream of ``(key, start, end, value)``)."""

    def __init__(
        self,
        keyed: KeyedStream[T, K],
        kind: WindowKind,
        name: str | None,
        allowed_lateness: float,
        late_output: str | None,
        timestamp: Callable[[T], float] | None,
        parallelism: int | None,
    ) -> None:
        label = name or "window"
        if not isinstance(kind, WindowKind):
            raise GraphError(
                f"step '{label}': window(...) needs a window kind (Tumbling, Sliding, Session, "
                f"TumblingProcessingTime from runtime.window_kinds), got {kind!r}."
            )
        kind.check(label)
        if (
            not isinstance(allowed_lateness, int | float)
            or isinstance(allowed_lateness, bool)
            or not 0 <= allowed_lateness < float("inf")
        ):
            raise GraphError(
                f"step '{label}': allowed_lateness must be a number >= 0, got {allowed_lateness!r}."
            )
        if not kind.event_time and (allowed_lateness or timestamp is not None):
            raise GraphError(
                f"step '{label}': a processing-time window has no allowed lateness and no "
                "timestamps; use an event-time window kind (Tumbling, Sliding, Session)."
            )
        if timestamp is not None:
            check_callable(timestamp, label, "timestamp function")
        self.keyed, self.kind, self.name = keyed, kind, name
        self.lateness, self.late_output, self.timestamp = allowed_lateness, late_output, timestamp
        self.parallelism = parallelism
        self._late: Stream[T] | None = None

    @property
    def late(self) -> Stream[T]:
        """The records later than the allowed lateness (needs ``late_output=`` and an
        aggregation first)."""
        if self._late is None:
            raise GraphError(
                f"window '{self.name or 'window'}': no late stream; pass late_output='name' to "
                "window(...) and call aggregate/reduce/count/process before using .late."
            )
        return self._late

    def _build(self, mode: str, fn: Callable[..., object], args: dict[str, object]) -> Stream[Any]:
        """The window step (and its late split); its caller says the output's record type."""
        label = self.name or "window"
        check_callable(fn, label, f"{mode} function")
        if self.kind.merging and mode == "aggregate" and args.get("merge") is None:
            raise GraphError(
                f"step '{label}': session windows merge, so aggregate(...) needs "
                "merge=fn(acc_a, acc_b) combining two accumulators (or use reduce/count)."
            )
        args = {
            **args,
            "kind": self.kind,
            "mode": mode,
            "allowed_lateness": self.lateness,
            "late_output": self.late_output,
            "timestamp_fn": self.timestamp,
            "event_time": self.kind.event_time or None,
            "output_timestamp_fn": _window_end,
        }
        stream = self.keyed._keyed(StepKind.WINDOW, fn, self.name, self.parallelism, args)
        if self.late_output is None:
            return stream
        main = stream.flat_map(_main, name=f"{stream.step.name}.main")
        main.step.args["output_timestamp_fn"] = _window_end
        self._late = stream.flat_map(_late, name=f"{self.late_output}.split")
        return Stream(main.flow, main.step)

    def aggregate(
        self,
        initial: A | Callable[[], A],
        add: Callable[[A, T], A],
        merge: Callable[[A, A], A] | None = None,
    ) -> Stream[tuple[K, float, float, A]]:
        """Incremental: ``acc = add(acc, record)`` from ``initial`` (a value, or a factory
        for mutable accumulators); session windows also need ``merge(acc_a, acc_b)``."""
        return self._build("aggregate", add, {"initial": initial, "merge": merge})

    def reduce(self, fn: Callable[[T, T], T]) -> Stream[tuple[K, float, float, T]]:
        """Incremental: ``fn(a, b)`` over the window's records (merging sessions too)."""
        return self._build("reduce", fn, {"merge": fn})

    def count(self) -> Stream[tuple[K, float, float, int]]:
        """The number of records per window."""
        return self._build("aggregate", _add_one, {"initial": 0, "merge": _plus})

    def process(
        self, fn: Callable[[K, float, float, list[T]], U]
    ) -> Stream[tuple[K, float, float, U]]:
        """Full window: ``fn(key, start, end, records)`` once the window fires (the
        window's records are kept until then)."""
        return self._build("process", fn, {})


def _add_one(n: int, _record: object) -> int:
    return n + 1


def _plus(a: int, b: int) -> int:
    return a + b
