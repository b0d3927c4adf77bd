"""The job manager's superstep driver against fakes: the agreement waits for every head,
decides on the totals, checkpoints at boundaries, ends, and records recoveries."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jobmanager.result import IterationProgress, SuperstepRecovery
from jobmanager.supersteps import IterationPhase, SuperstepDriver, superstep_step
from runtime import control as P
from runtime.api.iterations import iteration_dataflow
from runtime.iterations import l1_below
from runtime.iterations.library import ConnectedComponentsStep, PageRankStep


@dataclass
class FakeCoordinator:
    pending: dict[int, object] = field(default_factory=dict)
    completed: list[Any] = field(default_factory=list)  # of objects with a checkpoint_id
    triggered: list[int | None] = field(default_factory=list)
    next_id: int = 1

    def trigger(self, final: bool, *, superstep: int | None = None) -> int:
        n = self.next_id
        self.next_id += 1
        self.pending[n] = object()
        self.triggered.append(superstep)
        return n

    def complete(self, n: int) -> None:
        del self.pending[n]
        self.completed.append(type("Done", (), {"checkpoint_id": n})())


def driver(
    delta: bool = False, every: int | None = None, restored: int = 0, **kw: Any
) -> tuple[SuperstepDriver, list[tuple[int, P.Message]], FakeCoordinator, IterationProgress]:
    graph = {0: (1,), 1: (0,), 2: ()}
    if delta:
        flow = iteration_dataflow(
            "cc",
            ConnectedComponentsStep(),
            {v: v for v in graph},
            graph,
            list(graph),
            2,
            kw.get("max_supersteps"),
            None,
        )
    else:
        flow = iteration_dataflow(
            "pr",
            PageRankStep(3),
            dict.fromkeys(graph, 1 / 3),
            graph,
            None,
            2,
            kw.get("max_supersteps", 10),
            l1_below(1e-3),
        )
    plan = flow.plan()
    step = superstep_step(plan)
    assert step is not None
    sent: list[tuple[int, P.Message]] = []
    coordinator = FakeCoordinator()
    progress = kw.get("progress") or IterationProgress()
    d = SuperstepDriver(
        plan,
        step,
        lambda i, m: sent.append((i, m)),
        coordinator,
        progress,
        every,
        restored,
        clock=lambda: 0.0,
        compensator=kw.get("compensator"),
    )
    return d, sent, coordinator, progress


def done(
    d: SuperstepDriver,
    head: int,
    k: int,
    aggregate: float = 1.0,
    active: int = 1,
    sent: int = 2,
    received: int = 2,
) -> str | None:
    return d.on_done(P.SuperstepDone(head, 0, k, aggregate, active, sent, received, 0.0))


def test_supersteps_start_once_loaded_and_wait_for_every_head() -> None:
    d, sent, _, progress = driver()
    a, b = d.heads
    assert d.phase is IterationPhase.LOADING and sent == []
    d.on_loaded()
    assert sent == [(a, P.SuperstepGo(1)), (b, P.SuperstepGo(1))]
    sent.clear()
    assert done(d, a, 1) is None and sent == []  # one head is not the agreement
    assert done(d, a, 2) is None and sent == []  # not the superstep being run: ignored
    done(d, b, 1)
    assert sent == [(a, P.SuperstepGo(2)), (b, P.SuperstepGo(2))]
    assert progress.aggregates == [(1, 2.0)] and progress.supersteps_started == 2


def test_converged_bulk_iteration_emits_then_ends() -> None:
    d, sent, _, progress = driver()
    a, b = d.heads
    d.on_loaded()
    done(d, a, 1, aggregate=1e-4)
    done(d, b, 1, aggregate=1e-4)
    assert sent[-2:] == [(a, P.EmitSolution(1)), (b, P.EmitSolution(1))]
    assert progress.converged and d.phase is IterationPhase.EMITTING
    d.on_emitted(P.SolutionEmitted(a, 0, 1, 2))
    assert not d.ended
    d.on_emitted(P.SolutionEmitted(b, 0, 1, 1))
    assert d.ended


def test_delta_iteration_ends_on_an_empty_workset_and_max_supersteps_stops_bulk() -> None:
    d, sent, _, progress = driver(delta=True)
    a, b = d.heads
    d.on_loaded()
    done(d, a, 1, active=0)
    done(d, b, 1, active=0)
    assert isinstance(sent[-1][1], P.EmitSolution) and progress.converged
    d, sent, _, progress = driver(max_supersteps=1)
    d.on_loaded()
    done(d, a, 1)
    done(d, b, 1)
    assert isinstance(sent[-1][1], P.EmitSolution) and not progress.converged


def test_an_unbalanced_superstep_is_not_decided() -> None:
    d, sent, _, _ = driver()
    a, b = d.heads
    d.on_loaded()
    done(d, a, 1, sent=3, received=2)
    error = done(d, b, 1, sent=2, received=2)
    assert error is not None and "5 messages sent, 4 received" in error
    assert not any(isinstance(m, P.SuperstepGo) and m.superstep == 2 for _, m in sent)


def test_checkpoint_at_the_boundary_before_the_next_superstep() -> None:
    d, sent, coordinator, progress = driver(every=2)
    a, b = d.heads
    d.on_loaded()
    for k in (1, 2):
        done(d, a, k)
        done(d, b, k)
    assert coordinator.triggered == [2] and d.phase is IterationPhase.CHECKPOINT
    sent.clear()
    d.on_tick()
    assert sent == []  # pending: the next superstep waits
    coordinator.complete(1)
    d.on_tick()
    assert sent == [(a, P.SuperstepGo(3)), (b, P.SuperstepGo(3))]
    assert progress.checkpoints == [(2, 1)]


def test_a_failed_checkpoint_does_not_stop_the_iteration() -> None:
    d, sent, coordinator, progress = driver(every=1)
    a, b = d.heads
    d.on_loaded()
    done(d, a, 1)
    done(d, b, 1)
    coordinator.pending.clear()  # aborted
    d.on_tick()
    assert sent[-1] == (b, P.SuperstepGo(2)) and progress.checkpoints == []


def test_a_restored_attempt_goes_on_after_its_checkpoint_and_records_the_recovery() -> None:
    d, sent, coordinator, progress = driver(every=2)
    a, b = d.heads
    d.on_loaded()
    for k in (1, 2, 3):
        done(d, a, k)
        done(d, b, k)
        if k == 2:
            coordinator.complete(1)
        d.on_tick()
    assert sent[-1] == (b, P.SuperstepGo(4))
    d.on_failed()  # during superstep 4
    d2, sent2, _, _ = driver(every=2, restored=2, progress=progress)
    d2.on_loaded()
    assert sent2 == [(a, P.SuperstepGo(3)), (b, P.SuperstepGo(3))]
    assert progress.recoveries == [SuperstepRecovery(4, 2)] and progress.rerun == 2


def test_a_stop_waits_for_the_superstep_boundary() -> None:
    d, sent, _, _ = driver()
    a, b = d.heads
    d.on_loaded()
    stops: list[int] = []
    d.request_stop(stops.append)
    assert stops == []  # superstep 1 runs: its inbox is no state
    done(d, a, 1)
    done(d, b, 1)
    assert stops == [1] and d.phase is IterationPhase.STOPPED
    assert not any(isinstance(m, P.SuperstepGo) and m.superstep == 2 for _, m in sent)


def test_a_stop_while_loading_is_taken_at_once_with_the_restored_superstep() -> None:
    d, sent, _, _ = driver(restored=4)
    stops: list[int] = []
    d.request_stop(stops.append)
    assert stops == [4]
    d.on_loaded()
    assert sent == []  # no superstep after the savepoint
