"""Optimistic recovery's pure pieces (``jobmanager.optimistic``) without Spark or
processes: the compensation and its checks, the choice of the next restore point, the
rescue against a fake control plane and a real checkpoint storage, the rescue record in
``_metadata``, the driver's COMPENSATING phase, and the head's side of it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from channels.messages import decode_records, encode_data
from jobmanager.optimistic import (
    Compensator,
    OptimisticRun,
    RescueFailure,
    RescueOutcome,
    lost_heads,
    rescue_survivors,
)
from jobmanager.result import IterationProgress, RecoveryKind
from jobmanager.supersteps import IterationPhase, SuperstepDriver
from runtime import control as P
from runtime.api.iterations import iteration_dataflow
from runtime.config import OptimisticRecovery
from runtime.errors import IterationError
from runtime.iterations.library import (
    ConnectedComponentsStep,
    cc_compensation,
    pagerank_compensation,
)
from statebackend.metadata import CheckpointMetadata, OperatorLayout, RescueRecord, TaskStateHandle
from statebackend.snapshot import OperatorSnapshot
from statebackend.storage import CheckpointStorage
from tests.jobmanager.test_supersteps import driver


def frames(surviving: dict[Any, Any], lost: dict[Any, Any]) -> tuple[bytes, bytes]:
    return encode_data(0, list(surviving.items())), encode_data(0, list(lost.items()))


# -- the compensation ----------------------------------------------------------------------
def test_pagerank_compensation_restores_the_mass_on_exactly_the_lost_keys() -> None:
    c = Compensator(pagerank_compensation, delta=False, where="pr")
    values, workset, figures = c.compensate(
        [frames({0: 0.3, 1: 0.2}, {}), frames({}, {2: (0,), 3: ()})]
    )
    assert dict(decode_records(values)) == {2: pytest.approx(0.25), 3: pytest.approx(0.25)}
    assert decode_records(workset) == []
    assert figures.lost_keys == 2 and figures.mass_after == pytest.approx(1.0)


def test_cc_compensation_gets_the_lost_keys_side_input_and_adds_their_neighbours() -> None:
    c = Compensator(cc_compensation, delta=True, where="cc")
    values, workset, figures = c.compensate([frames({0: 0, 1: 0}, {2: (1, 0)})])
    assert dict(decode_records(values)) == {2: 2}
    assert set(decode_records(workset)) == {0, 1, 2} and figures.mass_after is None


def test_nothing_lost_calls_no_compensation() -> None:
    def never(*_: Any) -> Any:
        raise AssertionError("called")

    _, _, figures = Compensator(never, False, "pr").compensate([frames({0: 1.0}, {})])
    assert figures.lost_keys == 0


def _other_keys(surviving: Any, lost: frozenset[Any], side: Any) -> dict[Any, float]:
    return {k + 100: 0.0 for k in lost}


def _unknown_workset(surviving: Any, lost: frozenset[Any], side: Any) -> Any:
    return {k: k for k in lost}, {999}


def test_a_compensation_returning_other_keys_or_unknown_workset_keys_is_named() -> None:
    with pytest.raises(IterationError, match=r"'_other_keys' must return exactly the lost keys"):
        Compensator(_other_keys, False, "pr").compensate([frames({0: 1.0}, {1: ()})])
    with pytest.raises(IterationError, match=r"'_unknown_workset' added keys .* \['999'\]"):
        Compensator(_unknown_workset, True, "cc").compensate([frames({0: 0}, {1: ()})])
    with pytest.raises(IterationError, match=r"must return \(values, workset additions\)"):
        Compensator(pagerank_compensation, True, "cc").compensate([frames({0: 1.0}, {1: ()})])


# -- the rescue record and the next restore point -------------------------------------------
def metadata(n: int, superstep: int, rescue: RescueRecord | None = None) -> CheckpointMetadata:
    from statebackend.metrics import summarize

    return CheckpointMetadata(
        n, "cc", 0, False, 1.0, 2.0, 1.0, 128, {}, {}, summarize({}, "rescue", 1.0),
        superstep=superstep, rescue=rescue,
    )  # fmt: skip


RECORD = RescueRecord("cc:superstep", (1, 2), ((43, 86), (86, 128)), {1: 3, 2: 3}, (0,), 4)


def test_the_rescue_record_round_trips_through_metadata_and_others_have_none() -> None:
    back = CheckpointMetadata.from_json(metadata(7, 3, RECORD).to_json())
    assert back.rescue == RECORD and back.superstep == 3
    assert CheckpointMetadata.from_json(metadata(8, 3).to_json()).rescue is None
    assert '"rescue":' not in metadata(8, 3).to_json()  # other checkpoints are unchanged


def test_the_next_restore_is_the_rescue_else_the_newest_restore_point() -> None:
    run = OptimisticRun(OptimisticRecovery(cc_compensation))
    rescue = metadata(5, 3, RECORD)
    chosen, plan = run.next_restore(RescueOutcome(rescue), metadata(2, 2))
    assert chosen is rescue and plan.kind is RecoveryKind.OPTIMISTIC and plan.lost == (0,)
    # a second failure before a superstep: the rescue again (newer than checkpoint 2)
    chosen, plan = run.next_restore(
        RescueOutcome(failure=RescueFailure.NO_SUPERSTEP), metadata(2, 2)
    )
    assert chosen is rescue and plan.kind is RecoveryKind.OPTIMISTIC
    assert "restoring rescue snapshot 5" in plan.note
    # the compensated state was checkpointed (6, newer): that one
    newer = metadata(6, 3)
    chosen, plan = run.next_restore(RescueOutcome(failure=RescueFailure.TIMEOUT), newer)
    assert chosen is newer and plan.kind is RecoveryKind.CHECKPOINT
    assert plan.note.endswith("falling back to checkpoint 6 at superstep 3")
    fresh = OptimisticRun(OptimisticRecovery(cc_compensation))
    chosen, plan = fresh.next_restore(RescueOutcome(failure=RescueFailure.NO_SURVIVOR), None)
    assert chosen is None and plan.kind is RecoveryKind.START
    assert plan.note == "no rescue: no loop head survived; falling back to the start"


# -- the rescue against a fake control plane -------------------------------------------------
@dataclass
class Head:
    task_id: str
    subtask: int


HEADS = {3: Head("cc[0]", 0), 4: Head("cc[1]", 1), 5: Head("cc[2]", 2)}


def _plan() -> Any:
    graph = {0: (1,), 1: (0,), 2: ()}
    flow = iteration_dataflow(
        "cc", ConnectedComponentsStep(), {v: v for v in graph}, graph, list(graph), 3, None, None
    )
    return flow.plan()


def _handle(subtask: int, groups: tuple[int, int]) -> TaskStateHandle:
    name = "cc_step:superstep"
    storage = CheckpointStorage("/nonexistent-never-written", inline_threshold=4096)
    handle = storage.inline_handle(
        {name: OperatorSnapshot(None, b"keyed", None)}, {name: OperatorLayout(subtask, 3, groups)}
    )
    assert handle is not None
    return handle


def rescue(
    tmp_path: Path, answers: Sequence[P.Message], lost: list[int], **kw: Any
) -> tuple[RescueOutcome, list[tuple[int, P.Message]]]:
    sent: list[tuple[int, P.Message]] = []
    queue = list(answers)
    ticks = iter(range(10_000))

    def receive(_ms: int) -> Iterator[P.Message]:
        if queue:
            yield queue.pop(0)

    outcome = rescue_survivors(
        settings=OptimisticRecovery(cc_compensation, **kw),
        plan=_plan(),
        step_name="cc_step:superstep",
        heads=HEADS,
        lost=lost,
        attempt=0,
        restored=0,
        failed_during=4,
        checkpoint_id=9,
        storage=CheckpointStorage(str(tmp_path)),
        send=lambda i, m: sent.append((i, m)),
        receive=receive,
        gone=lambda _i: False,
        clock=lambda: next(ticks) * 0.1,
    )
    return outcome, sent


def test_the_survivors_state_is_written_as_a_typed_rescue_snapshot(tmp_path: Path) -> None:
    answers: list[P.Message] = [
        P.Rescued(4, 0, 9, 3, _handle(1, (43, 86))),
        P.Rescued(4, 1, 9, 3, _handle(1, (43, 86))),  # another attempt's: fenced
        P.Rescued(5, 0, 9, 3, _handle(2, (86, 128))),
    ]
    outcome, sent = rescue(tmp_path, answers, lost=[3])
    assert sent == [(4, P.Rescue(9)), (5, P.Rescue(9))]
    assert outcome.failure is None and outcome.checkpoint_id == 9
    meta = CheckpointStorage(str(tmp_path)).check(9)
    assert meta.superstep == 3 and sorted(meta.tasks) == ["cc[1]", "cc[2]"]
    assert meta.rescue == RescueRecord(
        "cc_step:superstep", (1, 2), ((43, 86), (86, 128)), {1: 3, 2: 3}, (0,), 4
    )


def test_a_rescue_fails_and_says_why(tmp_path: Path) -> None:
    outcome, sent = rescue(tmp_path, [], lost=[3, 4], max_lost_fraction=0.5)
    assert outcome.failure is RescueFailure.TOO_MANY_LOST and sent == []
    assert rescue(tmp_path, [], lost=[3, 4, 5])[0].failure is RescueFailure.NO_SURVIVOR
    outcome, _ = rescue(tmp_path, [P.Rescued(4, 0, 9, 3, _handle(1, (43, 86)))], [3])
    assert outcome.failure is RescueFailure.TIMEOUT and "['cc[2]']" in outcome.detail
    mixed = [
        P.Rescued(4, 0, 9, 3, _handle(1, (43, 86))),
        P.Rescued(5, 0, 9, 4, _handle(2, (86, 128))),
    ]
    assert rescue(tmp_path, mixed, [3])[0].failure is RescueFailure.MIXED_SUPERSTEPS
    closed = [P.Closed(5, 0)]
    assert rescue(tmp_path, closed, [3])[0].failure is RescueFailure.SURVIVOR_LOST
    assert CheckpointStorage(str(tmp_path)).completed_checkpoints() == []


def test_lost_heads_are_the_failed_one_and_the_gone_ones() -> None:
    assert lost_heads(
        HEADS, {"cc", "cc_step:superstep"}, ("cc_step:superstep", 1), lambda i: i == 5
    ) == [4, 5]
    assert lost_heads(HEADS, {"cc"}, ("cc:input", 1), lambda _i: False) == []


# -- the driver's COMPENSATING phase ---------------------------------------------------------
def phase(d: SuperstepDriver) -> IterationPhase:
    return d.phase  # read again (mypy narrows an attribute across calls)


def test_a_rescued_attempt_compensates_then_checkpoints_then_goes_on() -> None:
    progress = IterationProgress(failed_during=4)
    d, sent, coordinator, _ = driver(
        delta=True,
        restored=3,
        progress=progress,
        compensator=Compensator(cc_compensation, True, "cc"),
    )
    a, b = d.heads
    d.on_loaded()
    assert d.phase is IterationPhase.COMPENSATING
    assert sent == [(a, P.CompensationRequest()), (b, P.CompensationRequest())]
    sent.clear()
    d.on_compensation_input(P.CompensationInput(a, 0, *frames({0: 0, 1: 0}, {})))
    assert sent == []  # every head first
    d.on_compensation_input(P.CompensationInput(b, 0, *frames({}, {2: ()})))
    assert [type(m) for _, m in sent] == [P.Compensate, P.Compensate]
    assert dict(decode_records(sent[0][1].values)) == {2: 2}  # type: ignore[attr-defined]
    sent.clear()
    d.on_compensated(P.Compensated(a, 0, 0))
    d.on_compensated(P.Compensated(b, 0, 1))
    assert coordinator.triggered == [3] and phase(d) is IterationPhase.CHECKPOINT
    coordinator.complete(1)
    d.on_tick()
    assert sent == [(a, P.SuperstepGo(4)), (b, P.SuperstepGo(4))]
    (rec,) = progress.recoveries
    assert (rec.failed_during, rec.resumed_from, rec.lost_keys) == (4, 3, 1)


def test_a_failure_while_loading_is_recorded_as_a_recovery_too() -> None:
    """The old runtime lost this one: its summary said "3 attempt(s)" with one failure."""
    progress = IterationProgress()
    d, _, _, _ = driver(restored=3, progress=progress)
    d.on_failed()  # still loading
    driver(restored=3, progress=progress)
    (rec,) = progress.recoveries
    assert rec.loading and (rec.failed_during, rec.resumed_from, rec.rerun) == (3, 3, 0)
