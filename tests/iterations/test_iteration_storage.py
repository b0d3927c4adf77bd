"""Superstep checkpoints on an object store (``s3://`` on moto's server, with
``storage_options``), through the front users call (``it.run``): a kill, then a restore
that reads the checkpoint back from the store; and the run-time errors of a step."""

from __future__ import annotations

from typing import Any

import pytest

from jobmanager.failures import FailureCause
from runtime.iterations import IterationError, Recovery
from runtime.iterations.graphs import union_find_labels
from runtime.iterations.library import ConnectedComponentsStep
from statebackend import CheckpointStorage
from tests.conftest import FakeS3
from tests.iterations.graphs import CC_EDGES, N_CC, components

pytestmark = [pytest.mark.harness]

CC_REF = union_find_labels(N_CC, CC_EDGES)


def test_kill_then_restore_from_s3_gives_the_exact_components(s3: FakeS3, s3_root: str) -> None:
    recovery = Recovery("blocking", interval=2, checkpoint_dir=s3_root, storage_options=s3.options)
    result = components().run(
        recovery=recovery, kills=[(1, 5)], launcher="local", retained_checkpoints=10
    )
    assert result.solution == CC_REF
    (restart,) = result.job.restarts
    assert restart.cause is FailureCause.TASK_DIED and restart.restored_checkpoint is not None
    (rec,) = result.recoveries
    assert (rec.failed_during, rec.resumed_from) == (5, 4)
    storage = CheckpointStorage(s3_root, storage_options=s3.options)
    restored = storage.check(restart.restored_checkpoint)  # read back from the object store
    assert restored.superstep == 4
    assert set(restored.tasks) >= {f"components[{i}]" for i in range(3)}


class _Escaping(ConnectedComponentsStep):
    name = "escaping_cc"

    def messages(self, key: Any, value: int, side: Any) -> Any:
        return [(key + 10**6, value)]


def test_a_step_that_changes_the_key_set_fails_the_run_naming_the_step() -> None:
    with pytest.raises(Exception, match=r"escaping_cc.*key 100\d+") as failed:
        components(step=_Escaping()).run(recovery=Recovery("none"), launcher="local")
    assert "solution set" in str(failed.value) or isinstance(failed.value, IterationError)
