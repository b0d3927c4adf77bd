"""Whole-graph checks that depend on the job's settings (runtime/graph_checks.py)."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.api.dataflow import Dataflow
from runtime.errors import GraphError
from runtime.sources import CollectionSource


@pytest.mark.parametrize(
    "config",
    [{"snapshot_mode": "unaligned"}, {"aligned_timeout": 0.5}],
    ids=["unaligned", "aligned_timeout"],
)
def test_loops_reject_modes_without_aligned_regular_inputs(config: dict[str, Any]) -> None:
    flow = Dataflow("loopy", parallelism=2, checkpoint_interval=1.0, **config)
    loop = flow.source(CollectionSource([1, 2, 3]), name="nums").iterate(name="again")
    body = loop.stream.map(lambda x: x - 1, name="dec")
    loop.feedback(body.filter(lambda x: x > 0, name="more"))
    body.filter(lambda x: x <= 0, name="done").collect("out")
    with pytest.raises(GraphError, match=r"loop 'again': .* not supported on dataflows with loops"):
        flow.validate()
    flow.validate(flow.config.replace(snapshot_mode="exactly_once", aligned_timeout=None))


@pytest.mark.parametrize("mode", ["exactly_once", "at_least_once", "unaligned"])
def test_a_dataflow_without_loops_takes_every_mode(mode: str) -> None:
    flow = Dataflow("straight", parallelism=2, checkpoint_interval=1.0, snapshot_mode=mode)
    flow.source(CollectionSource([1, 2, 3]), name="nums").map(lambda x: x, name="m").collect("o")
    flow.validate()
