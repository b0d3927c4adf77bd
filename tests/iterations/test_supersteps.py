"""Superstep iterations as Dataflows on the streaming runtime (``runtime.superstep``,
``jobmanager.supersteps``), on the test harness: local task processes, real sockets, real
SIGKILL / SIGSTOP. Results are compared exactly with networkx / union-find and with a
failure-free run; each recovery has a companion showing the comparison catches a
recovery that is switched off."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from jobmanager.failures import FailureCause
from jobmanager.faults import Kill
from jobmanager.stop import request_stop, running_jobs
from runtime.api.iterations import IterationRun, RecoveryMode, run_on_streaming
from runtime.iterations import BulkIteration, Recovery, Step, l1_below
from runtime.iterations.graphs import adjacency, union_find_labels
from statebackend import CheckpointStorage
from tests.iterations.graphs import CC_EDGES, N_CC, components, networkx_ranks, pagerank

pytestmark = [pytest.mark.harness]

CC_REF = union_find_labels(N_CC, CC_EDGES)


def _min(a: int, b: int) -> int:
    return a if a <= b else b


class BulkComponentsStep(Step):
    """Connected components as a bulk iteration: every vertex sends its label every
    superstep and takes the smallest it heard of; the aggregate counts changed labels."""

    name = "bulk_components"
    combine = staticmethod(_min)

    def messages(self, key: Any, value: int, side: Any) -> list[tuple[Any, int]]:
        return [(t, value) for t in side or ()]

    def update(self, key: Any, value: int, inbox: Any, side: Any, total: float) -> int:
        return inbox if inbox is not None and inbox < value else value

    def aggregate(self, key: Any, old: int, new: int) -> float:
        return float(old != new)


def bulk_components(parallelism: int = 3, max_supersteps: int = 200) -> BulkIteration:
    return BulkIteration(
        "bulk_components",
        {v: v for v in range(N_CC)},
        BulkComponentsStep(),
        side=adjacency(N_CC, CC_EDGES, undirected=True),
        parallelism=parallelism,
        max_supersteps=max_supersteps,
        converged=l1_below(0.5),
    )


def _max_diff(a: dict[Any, float], b: dict[Any, float]) -> float:
    assert a.keys() == b.keys()
    return max(abs(a[k] - b[k]) for k in b)


def test_pagerank_and_components_match_the_references() -> None:
    ranks = run_on_streaming(pagerank())
    assert ranks.converged and ranks.job.restarts == []
    assert _max_diff(ranks.solution, networkx_ranks()) < 1e-8
    delta = run_on_streaming(components())
    assert delta.converged and delta.solution == CC_REF
    bulk = run_on_streaming(bulk_components())
    assert bulk.converged and bulk.solution == CC_REF


# Labels are integers: a run's result does not depend on the order messages arrive in
# (a PageRank sum does, in its last bits), so a recovered run must equal a clean one
# exactly. Stopped after 6 supersteps, before it converges, so a recovery that runs a
# superstep too many or too few gives other labels.
PARTIAL = 6


def test_a_killed_task_resumes_from_the_last_superstep_checkpoint_exactly(
    tmp_path: Path,
) -> None:
    clean = run_on_streaming(bulk_components(max_supersteps=PARTIAL))
    assert clean.supersteps == PARTIAL and not clean.converged and clean.solution != CC_REF
    # Killed right after the 2nd superstep checkpoint (superstep 4) completed.
    killed = run_on_streaming(
        bulk_components(max_supersteps=PARTIAL),
        Recovery("blocking", interval=2, checkpoint_dir=str(tmp_path)),
        faults=[Kill("bulk_components[1]", after_checkpoint=2)],
    )
    assert killed.solution == clean.solution  # record for record
    (restart,) = killed.job.restarts
    assert restart.cause is FailureCause.TASK_DIED and restart.restored_checkpoint == 2
    (rec,) = killed.recoveries
    assert rec.resumed_from == 4 and rec.failed_during >= 4
    assert killed.supersteps_started == PARTIAL + rec.rerun
    assert killed.checkpoints[:2] == [2, 4]


def test_companion_a_restore_that_forgets_its_superstep_is_caught(tmp_path: Path) -> None:
    """Recovery off where it matters: the state after superstep 4 is restored, but the
    job manager counts from 1 again: four supersteps too many, other labels."""
    clean = run_on_streaming(bulk_components(max_supersteps=PARTIAL))
    broken = run_on_streaming(
        bulk_components(max_supersteps=PARTIAL),
        Recovery("blocking", interval=2, checkpoint_dir=str(tmp_path)),
        faults=[Kill("bulk_components[1]", after_checkpoint=2)],
        debug_restart_supersteps=True,
    )
    assert len(broken.job.restarts) == 1
    assert broken.recoveries[0].resumed_from == 0  # ... on the state of superstep 4
    assert broken.solution != clean.solution


@pytest.fixture(scope="module")
def clean_partial() -> IterationRun:
    # On the harness as the module's tests (a module fixture is set up before the test's
    # own fixtures, the harness among them: it would start Spark otherwise)
    return run_on_streaming(bulk_components(max_supersteps=PARTIAL), launcher="local")


@pytest.mark.parametrize("style", ["blocking", "tail", "head"])
def test_every_checkpoint_style_recovers_a_killed_task_exactly(
    style: RecoveryMode, tmp_path: Path, clean_partial: IterationRun
) -> None:
    """Killed as superstep 5 starts, checkpoints every 2: blocking and tail completed the
    one of superstep 4 before 5 started; head writes it while 5 runs, so the kill finds
    it complete or not (then superstep 2's). Either way the labels are the clean run's."""
    killed = run_on_streaming(
        bulk_components(max_supersteps=PARTIAL),
        Recovery(style, interval=2, checkpoint_dir=str(tmp_path)),
        faults=[Kill("bulk_components[1]", after_superstep=5)],
    )
    assert killed.solution == clean_partial.solution  # record for record
    (rec,) = killed.recoveries
    assert rec.failed_during == 5
    assert rec.resumed_from == 4 if style != "head" else rec.resumed_from in (2, 4)
    assert killed.supersteps_started == PARTIAL + rec.rerun
    assert killed.job.restarts[0].restored_checkpoint is not None


@pytest.mark.parametrize("style", ["tail", "head"])
def test_a_delta_iteration_recovers_exactly_with_overlapping_checkpoints(
    style: RecoveryMode, tmp_path: Path
) -> None:
    killed = run_on_streaming(
        components(),
        Recovery(style, interval=1, checkpoint_dir=str(tmp_path)),
        faults=[Kill("components[0]", after_superstep=4)],
    )
    assert killed.solution == CC_REF
    (rec,) = killed.recoveries
    assert rec.failed_during == 4 and rec.resumed_from in (2, 3)
    assert rec.resumed_from == 3 or style == "head"


def test_a_killed_task_without_checkpoints_starts_over_and_is_still_exact() -> None:
    clean = run_on_streaming(components())
    killed = run_on_streaming(
        components(), Recovery("none"), faults=[Kill("components[0]", after_seconds=0.0)]
    )
    assert killed.solution == CC_REF == clean.solution
    assert len(killed.job.restarts) == 1


def test_a_stopped_task_is_detected_by_its_heartbeat_and_recovered(tmp_path: Path) -> None:
    it = pagerank(max_supersteps=9, tol=0.0)
    clean = run_on_streaming(it)
    stopped = run_on_streaming(
        it,
        Recovery("blocking", interval=3, checkpoint_dir=str(tmp_path)),
        faults=[Kill("pagerank[2]", after_checkpoint=1, signal=signal.SIGSTOP)],
        heartbeat_interval=0.1,
        heartbeat_timeout=1.5,
    )
    (restart,) = stopped.job.restarts
    assert restart.cause is FailureCause.HEARTBEAT_LOST
    assert stopped.recoveries[0].resumed_from == 3
    assert _max_diff(stopped.solution, clean.solution) < 1e-15  # summing order aside


def test_superstep_checkpoints_are_listed_by_the_cli(tmp_path: Path) -> None:
    result = run_on_streaming(
        components(), Recovery("blocking", interval=1, checkpoint_dir=str(tmp_path))
    )
    assert result.solution == CC_REF
    storage = CheckpointStorage(str(tmp_path))
    ids = storage.completed_checkpoints()
    supersteps = [storage.check(n).superstep for n in ids]
    assert supersteps[-1] is None  # the final checkpoint commits the result
    assert [k for k in supersteps if k is not None] == result.checkpoints[-len(ids) + 1 :]

    def cli(*args: str) -> str:
        command = [sys.executable, "-m", "jobmanager", "checkpoints", str(tmp_path), *args]
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout

    header = cli().splitlines()[1].split()
    assert header[:5] == ["id", "status", "final", "savepoint", "superstep"]
    for n, k in zip(ids[:-1], supersteps[:-1], strict=True):
        assert f"superstep {k}," in cli("--show", str(n))


def test_a_task_killed_as_a_superstep_starts_is_recovered_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    killed = run_on_streaming(
        components(),
        Recovery("blocking", interval=2, checkpoint_dir=str(tmp_path)),
        faults=[Kill("components[2]", after_superstep=5)],
    )
    assert killed.solution == CC_REF
    (rec,) = killed.recoveries
    assert (rec.failed_during, rec.resumed_from) == (5, 4)


def test_a_superstep_past_spill_threshold_spills_its_feedback_and_stays_exact() -> None:
    """Messages travel the loop's channels: a head drains its back-edges into a queue that
    spills to disk past ``spill_threshold`` (here 512 bytes); with the default threshold
    the same run keeps everything in memory."""

    def spilled(result: IterationRun) -> int:
        return sum(
            m.spilled_bytes
            for task, m in result.job.task_metrics.items()
            if task.startswith("bulk_components[")
        )

    small = run_on_streaming(bulk_components(), spill_threshold=512)
    assert small.solution == CC_REF and spilled(small) > 0
    default = run_on_streaming(bulk_components())
    assert default.solution == CC_REF and spilled(default) == 0


class SlowBulkComponentsStep(BulkComponentsStep):
    """A superstep takes at least 0.3 s (vertex 0 dawdles): time to stop mid-iteration."""

    def messages(self, key: Any, value: int, side: Any) -> list[tuple[Any, int]]:
        if key == 0:
            time.sleep(0.3)
        return super().messages(key, value, side)


@pytest.mark.parametrize("parallelism", [3, 4])
def test_an_iteration_stopped_with_a_savepoint_resumes_after_its_superstep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parallelism: int
) -> None:
    """The stop waits for the next superstep boundary; the savepoint records the superstep
    and the resumed run goes on after it to the same labels, at the parallelism it was
    stopped at or another (the solution set is keyed state; the back-edge log, empty at a
    boundary, is routed by key)."""
    monkeypatch.setenv("ABSFLOW_JOBS_DIR", str(tmp_path / "jobs"))
    it = bulk_components()
    it.spec = dataclasses.replace(it.spec, step=SlowBulkComponentsStep())
    chk = tmp_path / "chk"
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["run"] = run_on_streaming(
                it, Recovery("blocking", interval=1, checkpoint_dir=str(chk)), progress=False
            )
        except BaseException as err:
            outcome["error"] = err

    thread = threading.Thread(target=run)
    thread.start()
    storage = CheckpointStorage(str(chk))
    try:
        deadline = time.monotonic() + 120
        while "error" not in outcome and len(storage.completed_checkpoints()) < 2:
            assert time.monotonic() < deadline, "no superstep checkpoints"
            time.sleep(0.02)
        (job,) = [j for j in running_jobs() if j.job == "bulk_components"]
        request_stop(job)
    finally:
        thread.join(timeout=180)
    assert "error" not in outcome, outcome.get("error")
    first: IterationRun = outcome["run"]
    assert first.job.stopped and first.job.savepoint and first.solution == {}
    meta = storage.check(int(first.job.savepoint.rsplit("chk-", 1)[1]))
    assert meta.savepoint and meta.superstep == first.supersteps >= 2
    it.spec = dataclasses.replace(it.spec, parallelism=parallelism)
    second = run_on_streaming(it, restore_from=first.job.savepoint)
    assert second.solution == CC_REF and second.converged
    assert second.supersteps_started == second.supersteps - first.supersteps
