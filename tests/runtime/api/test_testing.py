"""The test harness's pieces (``runtime.api.testing``): ``TestingSource``'s reader and its
markers, ``ListSink`` on its own, and (marked ``harness``: local task processes) the
pipelines that show them working end to end under ``run_local``."""

from __future__ import annotations

import pickle
from typing import Any

import cloudpickle
import pytest

from runtime import Dataflow, TaskFailedError
from runtime.api.testing import ABORT, EOF, ListSink, TestingSource, TestingSourceAbort, run_local
from runtime.errors import OperatorFailure


def reader(items: list[Any], subtask: int = 0, parallelism: int = 1, step: str = "numbers") -> Any:
    source: TestingSource[Any] = TestingSource(items)
    source.validate(step)
    return source.create_reader(subtask, parallelism)


@pytest.mark.harness  # local task processes: the harness fixture (tests/conftest.py)
def test_list_source_to_list_sink() -> None:
    out: list[int] = []
    flow = Dataflow("double", parallelism=1)
    flow.source(TestingSource([1, 2, 3]), name="numbers").map(lambda x: 2 * x, name="dbl").sink(
        ListSink(out), name="doubled"
    )
    result = run_local(flow)
    assert out == [2, 4, 6] and result.output("doubled") == [2, 4, 6]
    assert result.records_in == 3 and result.restarts == []


@pytest.mark.harness  # local task processes: the harness fixture (tests/conftest.py)
def test_eof_ends_the_input_there() -> None:
    out: list[int] = []
    flow = Dataflow("eof", parallelism=1)
    flow.source(TestingSource([1, 2, EOF, 3, 4]), name="numbers").sink(ListSink(out), name="o")
    run_local(flow)
    assert out == [1, 2]


@pytest.mark.harness  # local task processes: the harness fixture (tests/conftest.py)
def test_abort_fails_the_job_naming_the_source_step() -> None:
    flow = Dataflow("abort", parallelism=1)
    flow.source(TestingSource([1, 2, ABORT, 3]), name="numbers").map(
        lambda x: x, name="same"
    ).collect("o")
    with pytest.raises(TaskFailedError) as info:
        run_local(flow)
    assert info.value.operator == "numbers"
    message = str(info.value)
    assert "operator 'numbers'" in message and TestingSourceAbort.__name__ in message
    assert "after 2 record(s)" in message


@pytest.mark.harness  # local task processes: the harness fixture (tests/conftest.py)
def test_abort_with_checkpoints_restarts_then_gives_up_as_a_deterministic_failure() -> None:
    flow = Dataflow("abort-chk", parallelism=1, checkpoint_interval=0.05)
    flow.source(TestingSource([*range(100), ABORT]), name="numbers").collect("o")
    with pytest.raises(TaskFailedError) as info:
        run_local(flow)
    assert info.value.operator == "numbers" and "failed the same way twice" in str(info.value)


def test_list_sink_needs_a_list() -> None:
    with pytest.raises(TypeError):
        ListSink(())  # type: ignore[arg-type]


def test_a_subtask_reads_its_stride_of_the_items_in_batches() -> None:
    items = list(range(10))
    first, second = reader(items, 0, 2), reader(items, 1, 2)
    assert first.read_batch(3) == [0, 2, 4] and first.read_batch(3) == [6, 8]
    assert first.read_batch(3) is None  # the end of its items
    assert second.read_batch(100) == [1, 3, 5, 7, 9]


def test_eof_ends_the_input_where_the_reading_subtask_meets_it() -> None:
    r = reader([1, 2, EOF, 3])
    assert r.read_batch(10) == [1, 2]  # a batch stops before a marker
    assert r.read_batch(10) is None and r.read_batch(10) is None  # and stays ended
    # subtask 1 of 2 reads items[1::2] = [2, 3]: it never meets the EOF
    assert reader([1, 2, EOF, 3], 1, 2).read_batch(10) == [2, 3]


def test_abort_raises_naming_the_step_and_the_records_before_it() -> None:
    r = reader([1, 2, 3, ABORT, 4], step="numbers")
    assert r.read_batch(2) == [1, 2] and r.read_batch(5) == [3]
    with pytest.raises(OperatorFailure) as info:
        r.read_batch(5)
    assert info.value.operator == "numbers"
    assert isinstance(info.value.cause, TestingSourceAbort)
    assert str(info.value.cause) == (
        "testing source 'numbers' (subtask 0) reached ABORT after 3 record(s)"
    )


def test_a_restored_reader_resumes_at_its_snapshot() -> None:
    items = [*range(5), EOF, 99]
    r = reader(items)
    assert r.read_batch(2) == [0, 1]
    state = pickle.loads(pickle.dumps(r.snapshot()))
    assert r.read_batch(10) == [2, 3, 4]
    again = reader(items)
    again.restore(state)
    assert again.read_batch(10) == [2, 3, 4] and again.read_batch(10) is None


def test_markers_stay_the_same_object_across_pickling() -> None:
    """The tasks get the source by cloudpickle: a marker must still be ``is EOF`` there."""
    assert pickle.loads(pickle.dumps(EOF)) is EOF
    assert cloudpickle.loads(cloudpickle.dumps([ABORT, EOF])) == [ABORT, EOF]
    shipped = cloudpickle.loads(cloudpickle.dumps(TestingSource([1, EOF, 2])))
    assert shipped.create_reader(0, 1).read_batch(10) == [1]
    assert repr(ABORT) == "runtime.api.testing.ABORT"


def test_a_list_sink_ships_without_its_list() -> None:
    out = [1, 2]
    shipped = cloudpickle.loads(cloudpickle.dumps(ListSink(out)))
    assert shipped.target == [] and out == [1, 2]  # the tasks' copy starts empty
