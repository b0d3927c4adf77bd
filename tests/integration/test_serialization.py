"""Records that cannot cross tasks fail the job at once, naming the step that made them."""

from __future__ import annotations

from typing import Any

import pytest

from runtime import Dataflow, TaskFailedError
from runtime.sources import CollectionSource

# On the test harness (local task processes); tests marked integration run on local
# Spark (see tests/conftest.py).
pytestmark = [pytest.mark.harness]


def _as_set(x: int) -> set[int]:
    return {x}


def _pair_with_set(x: int) -> tuple[int, set[int]]:
    return (x % 2, {x})


def into_collect(**config: Any) -> Dataflow:
    flow = Dataflow("sets", parallelism=1, **config)
    flow.source(CollectionSource(range(100)), name="numbers").map(_as_set, name="to_set").collect(
        "out"
    )
    return flow


def across_shuffle(**config: Any) -> Dataflow:
    flow = Dataflow("sets", parallelism=2, **config)
    (
        flow.source(CollectionSource(range(100)), name="numbers")
        .map(_pair_with_set, name="pair")
        .key_by(lambda t: t[0])
        .reduce(lambda a, _b: a, name="first")
        .collect("out")
    )
    return flow


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize(
    ("build", "step"),
    [
        pytest.param(into_collect, "to_set", marks=pytest.mark.integration),  # on local Spark
        (across_shuffle, "pair"),
    ],
    ids=["collect", "shuffle"],
)
def test_a_set_fails_fast_naming_its_step(build: Any, step: str, checkpointing: bool) -> None:
    config = {"checkpoint_interval": 0.05} if checkpointing else {}
    with pytest.raises(TaskFailedError) as info:
        build(**config).run()
    message = str(info.value)
    assert info.value.operator == step
    assert f"step '{step}' emitted a record that cannot cross tasks" in message
    assert "RecordSerializationError" in message and "'set'" in message
    assert "convert the set to a list/tuple" in message
    assert "restart(s)" not in message  # fatal: no restart was tried
