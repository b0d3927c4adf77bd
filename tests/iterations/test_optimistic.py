"""Optimistic recovery of superstep iterations on the streaming runtime
(``jobmanager.optimistic``), on the test harness: local task processes, real SIGKILL /
SIGSTOP. A killed loop head's key groups are rebuilt by the compensation function, the
survivors' come from their rescue snapshot; PageRank lands close to the failure-free
ranks, connected components exactly on the failure-free labels, and each check has a
companion (no compensation) that it catches."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from jobmanager.faults import Kill
from jobmanager.result import RecoveryKind
from runtime.api.iterations import run_on_streaming
from runtime.iterations import Recovery
from runtime.iterations.graphs import union_find_labels
from runtime.iterations.library import (
    ConnectedComponentsStep,
    cc_compensation,
    cc_without_compensation,
    pagerank_compensation,
    pagerank_without_compensation,
)
from statebackend import CheckpointStorage
from tests.iterations.graphs import CC_EDGES, N_CC, components, pagerank
from tests.iterations.test_supersteps import PARTIAL, bulk_components

pytestmark = [pytest.mark.harness]

CC_REF = union_find_labels(N_CC, CC_EDGES)
RUN: dict[str, Any] = {"launcher": "local", "progress": False}


def _max_diff(a: dict[Any, float], b: dict[Any, float]) -> float:
    assert a.keys() == b.keys()
    return max(abs(a[k] - b[k]) for k in b)


def _places(ranks: dict[Any, float]) -> dict[Any, int]:
    order = sorted(ranks, key=lambda v: (-ranks[v], v))
    return {v: i for i, v in enumerate(order)}


def _top_k_within(
    recovered: dict[Any, float], clean: dict[Any, float], k: int, places: int
) -> bool:
    """Seed 004's closeness: each of the clean run's top ``k`` vertices is within
    ``places`` places of its clean place in the recovered ranking."""
    mine, theirs = _places(recovered), _places(clean)
    top = [v for v, i in theirs.items() if i < k]
    return all(abs(mine[v] - theirs[v]) <= places for v in top)


@cache
def _clean_pagerank(parallelism: int) -> dict[Any, float]:
    return run_on_streaming(pagerank(parallelism), **RUN).solution


def _optimistic(compensation: Any, **kw: Any) -> Recovery:
    return Recovery("optimistic", compensation=compensation, **kw)


@pytest.mark.parametrize(("parallelism", "kill_at"), [(2, 2), (4, 12)], ids=["p2-early", "p4-late"])
def test_pagerank_recovers_optimistically_close_to_the_clean_ranks(
    parallelism: int, kill_at: int
) -> None:
    clean = _clean_pagerank(parallelism)
    run = run_on_streaming(
        pagerank(parallelism),
        _optimistic(pagerank_compensation),
        faults=[Kill(f"pagerank[{parallelism - 1}]", after_superstep=kill_at)],
        **RUN,
    )
    (rec,) = run.recoveries
    assert rec.kind is RecoveryKind.OPTIMISTIC and rec.lost == (parallelism - 1,)
    # the survivors' state after the superstep before the failed one: it runs again
    assert (rec.failed_during, rec.resumed_from, rec.rerun) == (kill_at, kill_at - 1, 1)
    assert rec.lost_keys > 0 and rec.mass_after == pytest.approx(1.0, abs=1e-9)
    assert run.converged
    assert sum(run.solution.values()) == pytest.approx(1.0, abs=1e-9)
    assert _max_diff(run.solution, clean) < 1e-6
    assert _top_k_within(run.solution, clean, k=20, places=10)


def test_companion_pagerank_without_compensation_loses_rank_mass() -> None:
    """A fixed budget of supersteps (no time to heal): with the lost vertices at 0 the
    ranks no longer sum to 1 and stray far further from the clean ranks."""
    fixed = pagerank(3, max_supersteps=9, tol=0.0)
    kill = [Kill("pagerank[2]", after_superstep=6)]
    clean = run_on_streaming(fixed, **RUN).solution
    good = run_on_streaming(fixed, _optimistic(pagerank_compensation), faults=kill, **RUN)
    bad = run_on_streaming(fixed, _optimistic(pagerank_without_compensation), faults=kill, **RUN)
    assert good.recoveries[0].mass_after == pytest.approx(1.0, abs=1e-9)
    assert bad.recoveries[0].mass_after is not None and bad.recoveries[0].mass_after < 0.9
    assert abs(sum(bad.solution.values()) - 1.0) > 1e-3
    assert sum(good.solution.values()) == pytest.approx(1.0, abs=1e-9)
    assert _max_diff(bad.solution, clean) > 10 * _max_diff(good.solution, clean)


def test_components_recover_optimistically_to_the_exact_labels_and_the_companion_does_not(
    tmp_path: Path,
) -> None:
    kill = [Kill("components[0]", after_superstep=3)]
    good = run_on_streaming(
        components(), _optimistic(cc_compensation, checkpoint_dir=str(tmp_path)), faults=kill, **RUN
    )
    assert good.solution == CC_REF
    (rec,) = good.recoveries
    assert rec.kind is RecoveryKind.OPTIMISTIC and (rec.failed_during, rec.resumed_from) == (3, 2)
    # the rescue snapshot: a partial checkpoint of the two surviving heads, typed as such
    (restart,) = good.job.restarts
    assert restart.restored_checkpoint is not None
    meta = CheckpointStorage(str(tmp_path)).check(restart.restored_checkpoint)
    assert meta.rescue is not None and meta.superstep == 2
    assert meta.rescue.subtasks == (1, 2) and meta.rescue.lost == (0,)
    assert meta.rescue.supersteps == {1: 2, 2: 2} and meta.rescue.failed_during == 3
    assert sorted(meta.tasks) == ["components[1]", "components[2]"]
    shown = subprocess.run(
        [sys.executable, "-m", "jobmanager", "checkpoints", str(tmp_path), "--show",
         str(restart.restored_checkpoint)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "rescue of 'connected_components:superstep' subtasks [1, 2] (lost [0]" in shown
    # the compensated state was checkpointed at the rescued superstep before going on
    assert good.checkpoints[0] == 2
    bad = run_on_streaming(components(), _optimistic(cc_without_compensation), faults=kill, **RUN)
    assert bad.recoveries[0].kind is RecoveryKind.OPTIMISTIC
    wrong = [v for v in CC_REF if bad.solution[v] != CC_REF[v]]
    assert wrong, "without re-activating the neighbours, lost vertices keep their own id"


def test_when_no_loop_head_survives_it_falls_back_to_the_checkpoint_exactly(
    tmp_path: Path,
) -> None:
    clean = run_on_streaming(bulk_components(2, max_supersteps=PARTIAL), **RUN)
    both = [Kill(f"bulk_components[{i}]", after_superstep=5) for i in range(2)]
    run = run_on_streaming(
        bulk_components(2, max_supersteps=PARTIAL),
        _optimistic(cc_compensation, fallback="blocking", interval=2, checkpoint_dir=str(tmp_path)),
        faults=both,
        **RUN,
    )
    assert run.solution == clean.solution  # record for record
    (rec,) = run.recoveries
    assert rec.kind is RecoveryKind.CHECKPOINT and rec.resumed_from == 4
    assert "no rescue" in rec.note and "falling back to checkpoint" in rec.note
    assert "note: no rescue" in run.summary()


def test_a_frozen_survivor_times_the_rescue_out_and_it_falls_back_to_the_start() -> None:
    kills = [
        Kill("components[0]", after_superstep=3),
        Kill("components[1]", after_superstep=3, signal=signal.SIGSTOP),
    ]
    run = run_on_streaming(
        components(2),
        _optimistic(cc_compensation, rescue_timeout=1.0),
        faults=kills,
        heartbeat_timeout=30.0,  # the rescue's own bound decides, not the heartbeat
        **RUN,
    )
    assert run.solution == CC_REF
    (rec,) = run.recoveries
    assert rec.kind is RecoveryKind.START and rec.resumed_from == 0
    assert "did not answer the rescue within rescue_timeout" in rec.note
    assert rec.note.endswith("falling back to the start")


def test_too_many_lost_falls_back_to_the_start_and_says_so() -> None:
    run = run_on_streaming(
        components(),
        _optimistic(cc_compensation, max_lost_fraction=0.0),
        faults=[Kill("components[1]", after_superstep=4)],
        **RUN,
    )
    assert run.solution == CC_REF
    (rec,) = run.recoveries
    assert rec.kind is RecoveryKind.START and "max_lost_fraction" in rec.note


def test_a_second_kill_while_the_next_attempt_loads_keeps_the_rescued_state() -> None:
    """The old runtime threw the compensated state away here and started over from
    superstep 0; now the rescue snapshot stays the restore point."""
    kills = [
        Kill("components[1]", after_superstep=4),
        Kill("components[2]", after_seconds=0.0, attempt=1),  # as attempt 1 starts
    ]
    run = run_on_streaming(components(), _optimistic(cc_compensation), faults=kills, **RUN)
    assert run.solution == CC_REF
    assert len(run.job.restarts) == 2
    first, second = run.recoveries  # every restart is a recovery
    assert (first.kind, first.failed_during, first.resumed_from) == (
        RecoveryKind.OPTIMISTIC,
        4,
        3,
    )
    assert second.kind is RecoveryKind.OPTIMISTIC and second.loading
    assert second.resumed_from == 3 and "restoring rescue snapshot" in second.note
    assert run.job.restarts[1].restored_checkpoint == run.job.restarts[0].restored_checkpoint
    # supersteps 1..4 in attempt 0, none in attempt 1, 4.. in attempt 2: never from 0
    assert run.supersteps_started == 4 + (run.supersteps - 3)
    assert run.summary().count("  failure ") == 2


# Tiny batches and one batch per channel: after the kill, the survivors' superstep
# messages to the dead head fill its channel and their sends block for good.
BLOCKING: dict[str, Any] = {"batch_size": 2, "channel_hwm": 1, "max_inflight_time": None}


class DawdlingComponentsStep(ConnectedComponentsStep):
    """Each task waits a second before its first message of a superstep (after the first):
    a kill as a superstep starts lands before any survivor sends, so the survivors' sends
    to the dead head block (without it they may all be sent before the kill lands, and
    nothing blocks)."""

    def __init__(self) -> None:
        self.updated = False

    def messages(self, key: Any, value: int, side: Any) -> Any:
        if self.updated:
            self.updated = False
            time.sleep(1.0)
        return super().messages(key, value, side)

    def update(self, key: Any, value: int, inbox: Any, side: Any, total: float) -> Any:
        self.updated = True
        return super().update(key, value, inbox, side, total)


def test_a_survivor_blocked_sending_to_the_dead_head_is_still_rescued() -> None:
    run = run_on_streaming(
        components(step=DawdlingComponentsStep()),
        _optimistic(cc_compensation, rescue_timeout=3.0),
        faults=[Kill("components[0]", after_superstep=3)],
        **BLOCKING,
        **RUN,
    )
    assert run.solution == CC_REF
    (rec,) = run.recoveries
    assert rec.kind is RecoveryKind.OPTIMISTIC and rec.resumed_from == 2


def test_companion_a_rescue_served_only_after_the_send_times_out() -> None:
    run = run_on_streaming(
        components(step=DawdlingComponentsStep()),
        _optimistic(cc_compensation, rescue_timeout=3.0),
        faults=[Kill("components[0]", after_superstep=3)],
        debug_rescue_after_send=True,
        **BLOCKING,
        **RUN,
    )
    assert run.solution == CC_REF  # from the start
    (rec,) = run.recoveries
    assert rec.kind is RecoveryKind.START and "rescue_timeout" in rec.note
