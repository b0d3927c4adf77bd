"""The job manager's row per task (jobmanager/services.py `TaskInfo`); the services an
attempt shares are exercised with fakes in test_attempt."""

from __future__ import annotations

import pytest

from jobmanager.services import TaskInfo


@pytest.mark.parametrize(
    ("task_id", "operator"),
    [("count[1]", "count"), ("src->map[0]", "src->map"), ("a[b][12]", "a[b]"), ("solo", "solo")],
)
def test_the_operator_is_the_chain_name_of_the_task_id(task_id: str, operator: str) -> None:
    assert TaskInfo(task_id, 0).operator == operator


def test_every_task_starts_unseen_with_metrics_of_its_own() -> None:
    a, b = TaskInfo("count[0]", 0), TaskInfo("count[1]", 1)
    assert (a.pid, a.last_seen, a.finished, a.closed) == (0, 0.0, False, False)
    assert a.metrics is not b.metrics
