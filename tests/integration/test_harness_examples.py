"""The examples' pipelines (their ``build`` functions) give the same output on the test
harness (``runtime.api.testing.run_local``: local task processes, no Spark) as on local
Spark: one small Spark run each."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest

from runtime.api.testing import run_local
from tests.integration.test_examples import load_example

# ``spark`` first: the session (and its JVM) exists before the harness counts processes.
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark", "harness")]

CHECKPOINTS = {"checkpoint_interval": 0.1}


def test_wordcount_on_the_harness_equals_local_spark(tmp_path: Any) -> None:
    wordcount = load_example("wordcount")
    paths = wordcount.make_corpus(str(tmp_path), 20_000)
    on_spark = wordcount.build(paths, 2, **CHECKPOINTS).run(launcher="spark")
    local = run_local(wordcount.build(paths, 2, **CHECKPOINTS))
    counts = local.output("counts")
    assert collections.Counter(counts) == collections.Counter(on_spark.output("counts"))
    words = collections.Counter(w for p in paths for w in Path(p).read_text().split())
    assert wordcount.final_counts(counts) == dict(words) and len(counts) == 20_000


def test_collatz_on_the_harness_equals_local_spark() -> None:
    collatz = load_example("collatz")
    on_spark = collatz.build(500, 2, **CHECKPOINTS).run(launcher="spark")
    local = run_local(collatz.build(500, 2, **CHECKPOINTS))
    assert sorted(local.output("steps")) == sorted(on_spark.output("steps"))
    assert sorted(local.output("steps")) == [(n, collatz.steps_directly(n)) for n in range(1, 501)]


def test_connected_components_on_the_harness_equals_local_spark() -> None:
    cc = load_example("connected_components")
    edges = cc.make_edges(2_000, 1_600)
    on_spark = cc.build(edges, 2, **CHECKPOINTS).run(launcher="spark")
    local = run_local(cc.build(edges, 2, **CHECKPOINTS))

    def components(updates: list[tuple[int, int]]) -> dict[int, int]:
        best: dict[int, int] = {}
        for vertex, label in updates:
            best[vertex] = min(label, best.get(vertex, label))
        return best

    # The label updates depend on the order messages meet; the components do not.
    assert components(local.output("labels")) == components(on_spark.output("labels"))
    assert components(local.output("labels")) == cc.union_find(edges)
    assert len(set(local.output("labels"))) == len(local.output("labels"))  # exactly once
