"""Build-time validation of the dataflow graph: every error names the step at fault."""

from __future__ import annotations

import threading

import pytest

from runtime.api.dataflow import Dataflow
from runtime.errors import GraphError, UnpicklableFunctionError
from runtime.graph import LogicalGraph, Partitioning, StepKind
from runtime.sinks import CollectSink
from runtime.sources import CollectionSource, GeneratorSource, TextFileSource


def ident(x: object) -> object:
    return x


def gen(count: int = 10) -> GeneratorSource:
    return GeneratorSource(ident, count)


def test_valid_flow_passes() -> None:
    flow = Dataflow("ok", parallelism=2)
    flow.source(gen(), name="src").map(ident, name="m").collect("out")
    flow.validate()
    plan = flow.plan()  # one chain src -> m -> out, two subtasks, no channels
    assert [t.task_id for t in plan.tasks] == ["src[0]", "src[1]"]
    assert [s.name for s in plan.chain_steps(plan.tasks[0])] == ["src", "m", "out"]
    assert plan.channels == []


def test_no_source() -> None:
    with pytest.raises(GraphError, match="no source"):
        Dataflow("empty").validate()


def test_no_source_in_logical_graph() -> None:
    graph = LogicalGraph()
    graph.add_step("lonely", StepKind.MAP, 1, fn=ident)
    with pytest.raises(GraphError, match="no source"):
        graph.validate()


def test_no_sink() -> None:
    flow = Dataflow("nosink")
    flow.source(gen(), name="src").map(ident, name="m")
    with pytest.raises(GraphError, match="no sink"):
        flow.validate()


def test_dangling_stream_names_the_step() -> None:
    flow = Dataflow("dangling")
    src = flow.source(gen(), name="src")
    src.collect("out")
    src.map(ident, name="forgotten")
    with pytest.raises(GraphError, match=r"'forgotten'.*never consumed"):
        flow.validate()


def test_forward_edge_needs_equal_parallelism() -> None:
    flow = Dataflow("fwd")
    flow.source(gen(), name="src", parallelism=2).map(ident, name="wide", parallelism=3).collect(
        "out"
    )
    with pytest.raises(GraphError, match=r"forward edge from 'src'.*to 'wide'") as info:
        flow.validate()
    assert "rebalance" in str(info.value)


def test_rebalance_fixes_parallelism_mismatch() -> None:
    flow = Dataflow("fwd")
    (
        flow.source(gen(), name="src", parallelism=2)
        .rebalance()
        .map(ident, name="wide", parallelism=3)
        .collect("out")
    )
    flow.validate()
    wide = flow.graph.steps[1]
    assert wide.inputs[0].partitioning is Partitioning.REBALANCE


def test_unpicklable_function_raises_at_build_time() -> None:
    lock = threading.Lock()
    flow = Dataflow("pickle")
    stream = flow.source(gen(), name="src")
    with pytest.raises(UnpicklableFunctionError, match=r"step 'locked'.*cannot be pickled"):
        stream.map(lambda x: (lock, x), name="locked")
    # Also a GraphError and a TypeError, so broad handlers catch it.
    assert issubclass(UnpicklableFunctionError, GraphError)
    assert issubclass(UnpicklableFunctionError, TypeError)


def test_unpicklable_key_function() -> None:
    lock = threading.Lock()
    flow = Dataflow("pickle")
    with pytest.raises(UnpicklableFunctionError, match="key function"):
        flow.source(gen(), name="src").key_by(lambda x: (lock, x))


def test_non_callable_function() -> None:
    flow = Dataflow("callable")
    with pytest.raises(GraphError, match=r"step 'm'.*must be callable.*int 42"):
        flow.source(gen(), name="src").map(42, name="m")  # type: ignore[arg-type]


def test_non_callable_key_function() -> None:
    flow = Dataflow("callable")
    with pytest.raises(GraphError, match="key function must be callable"):
        flow.source(gen(), name="src").key_by("k")  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1, "2", 1.5, True])
def test_bad_parallelism_of_a_step(bad: object) -> None:
    flow = Dataflow("par")
    with pytest.raises(GraphError, match=r"step 'm': parallelism must be a positive int"):
        flow.source(gen(), name="src").map(ident, name="m", parallelism=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1, "2"])
def test_bad_parallelism_of_a_source(bad: object) -> None:
    flow = Dataflow("par")
    with pytest.raises(GraphError, match="step 'src': parallelism"):
        flow.source(gen(), name="src", parallelism=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1, "2"])
def test_bad_default_parallelism_of_the_dataflow(bad: object) -> None:
    with pytest.raises(GraphError, match="parallelism must be a positive int"):
        Dataflow("par", parallelism=bad)  # type: ignore[arg-type]


def test_duplicate_step_name() -> None:
    flow = Dataflow("dup")
    stream = flow.source(gen(), name="src").map(ident, name="twice")
    with pytest.raises(GraphError, match="step name 'twice' is used twice"):
        stream.map(ident, name="twice")


def test_default_names_are_made_unique() -> None:
    flow = Dataflow("names")
    flow.source(gen()).map(ident).map(ident).collect()
    assert [s.name for s in flow.graph.steps] == ["generator", "map", "map_2", "collect"]


def test_invalid_step_name() -> None:
    flow = Dataflow("names")
    with pytest.raises(GraphError, match="invalid"):
        flow.source(gen(), name="a[0]")


def test_union_with_stream_of_another_dataflow() -> None:
    flow, other = Dataflow("one"), Dataflow("two")
    a = flow.source(gen(), name="a")
    b = other.source(gen(), name="b")
    with pytest.raises(GraphError, match="union 'u': stream 'b' belongs to another Dataflow"):
        a.union(b, name="u")


def test_union_needs_another_stream() -> None:
    flow = Dataflow("u")
    with pytest.raises(GraphError, match="union 'u' needs at least one"):
        flow.source(gen(), name="a").union(name="u")


def test_keyed_parallelism_above_max_parallelism() -> None:
    flow = Dataflow("keyed", max_parallelism=4)
    (
        flow.source(gen(), name="src")
        .key_by(ident)
        .reduce(lambda a, b: b, name="big", parallelism=5)
        .collect("out", parallelism=5)
    )
    with pytest.raises(GraphError, match="keyed step 'big' has parallelism 5 > max_parallelism 4"):
        flow.validate()


def test_keyed_parallelism_equal_to_max_parallelism_is_fine() -> None:
    flow = Dataflow("keyed", max_parallelism=4)
    (
        flow.source(gen(), name="src")
        .key_by(ident)
        .reduce(lambda a, b: b, name="r", parallelism=4)
        .collect("out")
    )
    flow.validate()
    plan = flow.plan()
    assert [t.task_id for t in plan.tasks if t.task_id.startswith("r[")] == [
        f"r[{i}]" for i in range(4)
    ]
    assert len(plan.channels) == 4  # src[0] hashes into each of the 4 key-group ranges


def test_sink_with_a_non_sink() -> None:
    flow = Dataflow("sink")
    with pytest.raises(GraphError, match=r"needs a runtime.sinks.Sink instance.*got list"):
        flow.source(gen(), name="src").sink([], name="s")  # type: ignore[arg-type]


def test_sink_class_instead_of_instance() -> None:
    flow = Dataflow("sink")
    with pytest.raises(GraphError, match="got type"):
        flow.source(gen(), name="src").sink(CollectSink)  # type: ignore[arg-type]


def test_source_with_a_non_source() -> None:
    flow = Dataflow("source")
    with pytest.raises(GraphError, match=r"needs a runtime.sources.Source instance.*got list"):
        flow.source([1, 2, 3])  # type: ignore[arg-type]


def test_text_source_glob_matching_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    flow = Dataflow("text")
    pattern = str(tmp_path / "*.txt")
    with pytest.raises(GraphError, match=r"source 'lines': no file matches"):
        flow.source(TextFileSource(pattern), name="lines")


def test_text_source_missing_plain_path(tmp_path) -> None:  # type: ignore[no-untyped-def]
    flow = Dataflow("text")
    with pytest.raises(GraphError, match="source 'text': no file matches"):
        flow.source(TextFileSource(str(tmp_path / "missing.txt")))


def test_generator_source_settings_are_validated() -> None:
    flow = Dataflow("gen")
    with pytest.raises(GraphError, match="source 'g': count must be"):
        flow.source(GeneratorSource(ident, -1), name="g")
    with pytest.raises(GraphError, match="source 'g2': rate must be > 0"):
        flow.source(GeneratorSource(ident, 5, rate=0), name="g2")
    with pytest.raises(GraphError, match="source 'g3': GeneratorSource needs a callable"):
        flow.source(GeneratorSource(5, 5), name="g3")  # type: ignore[arg-type]


def test_collection_source_builds() -> None:
    flow = Dataflow("coll")
    flow.source(CollectionSource([1, 2]), name="c").collect("out")
    flow.validate()
    (step,) = [s for s in flow.plan().steps if s.name == "c"]
    assert isinstance(step.fn, CollectionSource) and step.parallelism == 1
