"""Iterations on the real launcher: one Spark barrier stage per attempt, a real SIGKILL
of a task's Python worker, the rescue read of the survivors before they are ended."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.iterations import Recovery
from runtime.iterations.graphs import union_find_labels
from runtime.iterations.library import cc_compensation
from tests.conftest import FakeS3
from tests.iterations.graphs import CC_EDGES, N_CC, components, networkx_ranks, pagerank

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("no_leaks")]


def test_sigkill_then_optimistic_recovery_on_spark_gives_the_exact_components() -> None:
    recovery = Recovery("optimistic", compensation=cc_compensation)
    result = components().run(recovery=recovery, kills=[(2, 3)], launcher="spark")
    assert result.solution == union_find_labels(N_CC, CC_EDGES)
    (rec,) = result.recoveries
    assert rec.kind == "optimistic" and rec.lost_partitions == (2,) and rec.rerun == 1
    assert "died" in rec.reason


def test_sigkill_then_tail_checkpoint_recovery_on_spark_converges_to_networkx() -> None:
    result = pagerank().run(recovery=Recovery("tail", interval=2), kills=[(0, 5)], launcher="spark")
    (rec,) = result.recoveries
    assert rec.kind == "checkpoint" and rec.resumed_from == 4
    ref = networkx_ranks()
    assert max(abs(result.solution[v] - ref[v]) for v in ref) < 1e-4


def test_sigkill_then_blocking_restore_from_s3_on_spark(s3: FakeS3, s3_root: str) -> None:
    """Every task reads its input from, and writes its superstep checkpoints to, moto's
    S3; a task's Python worker is SIGKILLed and the next barrier stage restores from S3."""
    recovery = Recovery("blocking", interval=2, checkpoint_dir=s3_root, storage_options=s3.options)
    result = components().run(recovery=recovery, kills=[(1, 5)], launcher="spark")
    assert result.solution == union_find_labels(N_CC, CC_EDGES)
    (rec,) = result.recoveries
    assert rec.kind == "checkpoint" and rec.resumed_from == 4 and "died" in rec.reason
    assert result.checkpoint_root is not None and result.checkpoint_root.startswith("s3://")


def test_streaming_runtime_iteration_on_spark_resumes_from_its_superstep_checkpoint(
    tmp_path: Path,
) -> None:
    """The iteration as a Dataflow on the streaming runtime (``runtime.superstep``): one
    barrier stage per attempt, a SIGKILLed Python worker, the next stage restores the
    superstep checkpoint through the checkpoint storage and ends with union-find's labels."""
    from jobmanager.faults import Kill
    from runtime.api.iterations import run_on_streaming

    result = run_on_streaming(
        components(),
        Recovery("blocking", interval=1, checkpoint_dir=str(tmp_path)),
        faults=[Kill("components[1]", after_checkpoint=2)],
        launcher="spark",
    )
    assert result.solution == union_find_labels(N_CC, CC_EDGES)
    (rec,) = result.recoveries
    assert rec.resumed_from == 2 and len(result.job.restarts) == 1
