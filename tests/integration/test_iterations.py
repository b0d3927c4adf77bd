"""Iterations on the real launcher: one Spark barrier stage per attempt, a real SIGKILL
of a task's Python worker; the next stage restores the superstep checkpoint through the
checkpoint storage (an object store here), or the survivors' rescued key groups."""

from __future__ import annotations

import pytest

from jobmanager.failures import FailureCause
from runtime.iterations import Recovery
from runtime.iterations.graphs import union_find_labels
from runtime.iterations.library import cc_compensation
from tests.conftest import FakeS3
from tests.iterations.graphs import CC_EDGES, N_CC, components

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("no_leaks")]

CC_REF = union_find_labels(N_CC, CC_EDGES)


def test_sigkill_then_optimistic_recovery_on_spark_gives_the_exact_components() -> None:
    recovery = Recovery("optimistic", compensation=cc_compensation)
    result = components().run(recovery=recovery, kills=[(2, 3)], launcher="spark")
    assert result.solution == CC_REF
    (rec,) = result.recoveries
    assert rec.failed_during == 3
    assert result.job.restarts[0].cause is FailureCause.TASK_DIED


def test_sigkill_then_restore_from_s3_on_spark(s3: FakeS3, s3_root: str) -> None:
    """Every task writes its superstep checkpoints to moto's S3; a task's Python worker is
    SIGKILLed and the next barrier stage restores from S3."""
    recovery = Recovery("blocking", interval=2, checkpoint_dir=s3_root, storage_options=s3.options)
    result = components().run(
        recovery=recovery, kills=[(1, 5)], launcher="spark", retained_checkpoints=10
    )
    assert result.solution == CC_REF
    (rec,) = result.recoveries
    assert (rec.failed_during, rec.resumed_from) == (5, 4)
    (restart,) = result.job.restarts
    assert restart.cause is FailureCause.TASK_DIED and restart.restored_checkpoint is not None
