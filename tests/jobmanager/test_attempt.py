"""An attempt driven by scripted control messages against fakes: dispatch, the loop's
checks, the end of a failed or cancelled attempt (no Spark, no sockets, no processes)."""

from __future__ import annotations

import math
import signal
from dataclasses import dataclass

import pytest

from jobmanager.attempt import Attempt
from jobmanager.failures import FailureCause
from jobmanager.fault_schedule import FaultSchedule
from jobmanager.faults import DriverKill
from jobmanager.liveness import Liveness
from jobmanager.metrics import CommittedOutputs, RecordCounts, RunMetrics
from jobmanager.services import RunServices
from runtime import Dataflow
from runtime import control as P
from runtime.config import JobConfig
from runtime.control import TaskFailureCause
from runtime.plan import JobPlan
from runtime.sources import GeneratorSource
from statebackend.metrics import AckMetrics, TaskMetrics
from tests.jobmanager.fakes import (
    Clock,
    FakeMonitor,
    FakeStage,
    NoProgress,
    Processes,
    ScriptedLink,
    ident,
    last,
    small_plan,
)

PIDS = {0: 100, 1: 101, 2: 102, 3: 103}
TASK_IDS = ["src[0]", "src[1]", "count[0]", "count[1]"]


@dataclass
class Harness:
    attempt: Attempt
    link: ScriptedLink
    clock: Clock
    procs: Processes
    monitor: FakeMonitor
    stage: FakeStage
    metrics: RunMetrics
    outputs: CommittedOutputs


def harness(
    config: JobConfig | None = None,
    kills: tuple[DriverKill, ...] = (),
    tick: float = 0.02,
    plan: JobPlan | None = None,
) -> Harness:
    plan = plan or small_plan()
    config = config or JobConfig()
    clock = Clock()
    link = ScriptedLink(clock, tick)
    procs = Processes(set(PIDS.values()))
    monitor = FakeMonitor()
    liveness = Liveness(
        {"h"},
        config.heartbeat_timeout,
        monitor,
        procs.is_alive,
        procs.port_in_use,
        procs.signal,
        clock=clock,
        sleep=clock.advance,
    )
    faults = FaultSchedule(list(kills))
    faults.start_attempt(0)
    metrics = RunMetrics(plan)
    metrics.start_attempt(None)
    outputs = CommittedOutputs(plan)
    services = RunServices(
        link, liveness, faults, metrics, outputs, NoProgress(), procs.signal, clock, lambda: 5000.0
    )
    attempt = Attempt(0, plan, config, None, 1, services, job_started=clock(), submit_wall=4990.0)
    return Harness(attempt, link, clock, procs, monitor, FakeStage(), metrics, outputs)


def registers(attempt: int = 0, host: str = "h") -> list[P.Message]:
    return [
        P.Register(i, attempt, TASK_IDS[i], PIDS[i], host, f"tcp://{host}:{7000 + i}")
        for i in range(4)
    ]


USER, TASK = TaskFailureCause.USER_FUNCTION_RAISED, TaskFailureCause.TASK_ERROR


def beat(
    records_in: int = 0, records_out: int = 0, rss: int = 0, first: float = 0.0
) -> TaskMetrics:
    return TaskMetrics(
        records_in=records_in, records_out=records_out, rss_bytes=rss, first_record_at=first
    )


def ack(i: int, n: int, records_in: int, records_out: int) -> P.Ack:
    return P.Ack(i, 0, n, None, AckMetrics(records_in=records_in, records_out=records_out))


# -- dispatch ---------------------------------------------------------------------------------
def test_register_and_heartbeat_fill_the_task_table_and_are_answered() -> None:
    h = harness()
    for msg in registers():
        assert h.attempt.on_message(msg) is None
    assert h.attempt.registered == {0, 1, 2, 3}
    assert h.attempt.tasks[3].pid == 103 and h.attempt.tasks[3].operator == "count"
    h.attempt.on_message(P.Heartbeat(0, 0, beat(500, 500, 2**20, 4991.5)))
    t = h.attempt.tasks[0]
    assert (t.records_in, t.records_out, t.peak_rss, t.first_record_at) == (500, 500, 2**20, 4991.5)
    assert h.link.sent_of(P.Alive) == [(0, P.Alive())]


def aligned_plan() -> JobPlan:
    """``small_plan`` with watermark alignment on its sources (tasks 0, 1)."""
    flow = Dataflow("job", parallelism=2)
    flow.source(GeneratorSource(ident, 10), name="src").assign_timestamps(
        ident, max_drift=100
    ).key_by(ident).reduce(last, name="count").collect("out")
    return flow.plan()


def test_aligned_sources_are_answered_the_lowest_watermark_that_holds_event_time_back() -> None:
    h = harness(plan=aligned_plan())
    assert h.attempt.aligned == {0, 1}
    for msg in registers():
        h.attempt.on_message(msg)

    def answer(i: int, **figures: object) -> object:
        h.attempt.on_message(P.Heartbeat(i, 0, TaskMetrics(**figures)))  # type: ignore[arg-type]
        alive = h.link.sent_of(P.Alive)[-1][1]
        assert isinstance(alive, P.Alive)
        return alive.aligned_watermark

    assert answer(0, watermark=1000.0) == -math.inf  # source 1 has reported none: wait
    assert answer(1, watermark=500.0) == 500.0
    assert answer(0, watermark=1200.0) == 500.0
    assert answer(2, watermark=400.0) is None  # not a source: no alignment
    assert answer(1, watermark=500.0, watermark_idle=True) == 1200.0  # idle: not counted
    h.attempt.on_message(P.SourceEnded(0, 0))
    assert answer(1, watermark=600.0, watermark_idle=True) is None  # none holds it back
    assert harness().attempt.aligned == frozenset()  # no max_drift, no alignment


def test_a_user_function_error_names_operator_subtask_and_exception() -> None:
    h = harness()
    failure = h.attempt.on_message(
        P.Failed(3, 0, USER, "count", 1, "ValueError: bad line", "Traceback ...", False)
    )
    assert failure is not None
    assert failure.cause is FailureCause.USER_FUNCTION_RAISED
    assert (failure.operator, failure.subtask, failure.permanent) == ("count", 1, None)
    assert failure.describe() == (
        "a user function raised in operator 'count' (subtask 1): ValueError: bad line"
    )


def test_a_task_error_and_a_fatal_one() -> None:
    h = harness()
    task_error = h.attempt.on_message(
        P.Failed(0, 0, TASK, "src[0]", 0, "OSError: disk", "tb", False)
    )
    assert task_error is not None and task_error.cause is FailureCause.TASK_ERROR
    fatal = h.attempt.on_message(
        P.Failed(0, 0, TASK, "src[0]", 0, "RuntimeError: cannot restore", "tb", True)
    )
    assert fatal is not None and fatal.permanent is not None
    assert "restart cannot fix" in fatal.permanent


def test_sink_output_and_acks_feed_outputs_and_metrics() -> None:
    h = harness()
    h.attempt.on_message(P.SinkOutput(2, 0, "out", 0, 1, [1, 2]))
    h.attempt.on_message(P.SinkOutput(2, 0, "out", 0, 1, [9]))  # a re-commit: first copy wins
    assert h.outputs.outputs() == {"out": [1, 2]}
    h.attempt.on_message(ack(2, 1, 7, 6))
    assert (h.attempt.tasks[2].records_in, h.attempt.tasks[2].records_out) == (7, 6)


# -- the loop ---------------------------------------------------------------------------------
def finished(i: int, records_in: int, records_out: int) -> P.Finished:
    return P.Finished(i, 0, TaskMetrics(records_in=records_in, records_out=records_out))


def test_an_attempt_runs_to_the_end_with_committed_counts() -> None:
    h = harness()
    h.link.then(*registers())
    h.link.then(
        P.Heartbeat(0, 0, beat(4, 4, 1, 4991.25)), P.Failed(0, 1, USER, "x", 0, "E: old", "", False)
    )
    h.link.then(P.SourceEnded(0, 0), P.SourceEnded(1, 0))
    h.link.then(ack(0, 1, 5, 5), ack(1, 1, 5, 5), ack(2, 1, 6, 6), ack(3, 1, 4, 4))
    h.link.then(P.SinkOutput(2, 0, "out", 0, 1, list(range(6))))
    h.link.then(P.SinkOutput(3, 0, "out", 1, 1, list(range(4))))
    h.link.then(finished(0, 5, 5), finished(1, 5, 5), finished(2, 6, 6), finished(3, 4, 4))
    assert h.attempt.run(h.stage) is None  # the straggler of attempt 1 was ignored
    assert h.attempt.failure is None and not h.stage.cancelled
    triggers = [m for _i, m in h.link.sent_of(P.Trigger) if isinstance(m, P.Trigger)]
    assert [(m.checkpoint_id, m.final) for m in triggers] == [(1, True), (1, True)]
    assert len(h.link.sent_of(P.Complete)) == 4 and not h.link.sent_of(P.Cancel)
    h.metrics.end_attempt(h.attempt.tasks, True, [])
    assert h.metrics.committed() == RecordCounts(10, 10)
    assert len(h.outputs.outputs()["out"]) == 10
    assert h.metrics.startup_seconds == pytest.approx(1.25)


def test_a_dead_task_ends_the_attempt_and_the_survivors_are_ended() -> None:
    h = harness()

    def die() -> list[P.Message]:
        h.procs.alive.discard(103)
        h.monitor.disconnect()
        return []

    h.link.then(*registers()).then(die)
    h.link.then(P.Closed(0, 0), P.Closed(1, 0))  # count[0] does not close: it gets a SIGKILL
    failure = h.attempt.run(h.stage)
    assert failure is not None and failure.cause is FailureCause.TASK_DIED
    assert (failure.operator, failure.subtask) == ("count", 1)
    assert failure.error == "task count[1] (pid 103) is gone"
    assert sorted(i for i, _m in h.link.sent_of(P.Cancel)) == [0, 1, 2, 3]
    assert h.procs.signals == [(102, signal.SIGKILL)]
    assert h.stage.cancelled


def test_a_task_report_that_arrives_after_its_process_is_gone_wins() -> None:
    """On a loaded machine a task that raised may be seen gone before its Failed report is
    read: the report (operator, exception, fatal) decides, not the bare death."""
    h = harness()

    def die() -> list[P.Message]:
        h.procs.alive.discard(100)
        h.monitor.disconnect()
        return []

    h.link.then(*registers()).then(die).then()
    h.link.then(P.Failed(0, 0, TASK, "src[0]", 0, "CheckpointStorageError: no bucket", "tb", True))
    failure = h.attempt.run(h.stage)
    assert failure is not None and failure.cause is FailureCause.TASK_ERROR
    assert failure.permanent is not None and "no bucket" in failure.describe()


def test_a_disconnect_without_a_dead_process_is_no_failure() -> None:
    h = harness()
    h.link.then(*registers()).then_do(h.monitor.disconnect)
    h.link.then(P.SourceEnded(0, 0), P.SourceEnded(1, 0))
    h.link.then(ack(0, 1, 1, 1), ack(1, 1, 1, 1), ack(2, 1, 1, 1), ack(3, 1, 1, 1))
    h.link.then(finished(0, 1, 1), finished(1, 1, 1), finished(2, 1, 1), finished(3, 1, 1))
    assert h.attempt.run(h.stage) is None


def test_a_silent_task_is_a_lost_heartbeat() -> None:
    h = harness(JobConfig(heartbeat_timeout=1.0), tick=0.4)
    h.link.then(*registers())
    for _ in range(4):
        h.link.then(*[P.Heartbeat(i, 0, beat(rss=1)) for i in (0, 1, 2)])
    failure = h.attempt.run(h.stage)
    assert failure is not None and failure.cause is FailureCause.HEARTBEAT_LOST
    assert (failure.operator, failure.subtask) == ("count", 1)
    assert "heart" in failure.describe()


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        ("Python worker exited unexpectedly (crashed)", FailureCause.TASK_DIED),
        ("org.apache.spark.api.python.PythonException: Traceback", FailureCause.TASK_ERROR),
        ("Could not recover from a failed barrier ResultStage", FailureCause.STAGE_FAILED),
    ],
)
def test_a_failed_stage_is_classified(text: str, cause: FailureCause) -> None:
    h = harness()
    h.link.then(*registers()).then_do(lambda: h.stage.outcome.put(Exception(text)))
    failure = h.attempt.run(h.stage)
    assert failure is not None and failure.cause is cause and failure.error == text


def test_a_worker_lost_while_the_tasks_start_is_a_failure_that_says_so() -> None:
    h = harness()
    crashed = (
        "An error occurred while calling o42.collectAndServe.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure\n"
        "\tat org.apache.spark.Foo\n"
        "org.apache.spark.SparkException: Python worker exited unexpectedly (crashed)"
    )
    h.link.then(*registers()[:1]).then_do(lambda: h.stage.outcome.put(Exception(crashed)))
    failure = h.attempt.run(h.stage)
    assert failure is not None and failure.cause is FailureCause.TASK_DIED
    assert failure.permanent is None
    assert failure.describe() == (
        "a task process died (killed or crashed): while the tasks were starting "
        "(1 of 4 registered): org.apache.spark.SparkException: Python worker exited "
        "unexpectedly (crashed)"
    )


def test_a_stage_that_ended_without_every_task_finishing() -> None:
    h = harness(tick=1.0)
    h.link.then(*registers()).then_do(lambda: h.stage.outcome.put(None))
    failure = h.attempt.run(h.stage)
    assert failure is not None and failure.cause is FailureCause.STAGE_ENDED_EARLY


def test_a_registration_timeout_is_left_to_the_restart_strategy_a_job_timeout_is_not() -> None:
    h = harness(tick=10.0)
    failure = h.attempt.run(h.stage)
    assert failure is not None and failure.cause is FailureCause.REGISTRATION_TIMEOUT
    assert failure.permanent is None and "did not register within" in str(failure.error)
    h = harness(JobConfig(timeout=1.0), tick=0.3)
    h.link.then(*registers())
    for _ in range(5):
        h.link.then(*[P.Heartbeat(i, 0, beat(rss=1)) for i in range(4)])
    failure = h.attempt.run(h.stage)
    assert failure is not None and failure.cause is FailureCause.JOB_TIMEOUT
    assert failure.permanent == "the job ran longer than timeout=1.0 s"


def test_ctrl_c_ends_the_tasks_and_propagates() -> None:
    h = harness()
    h.link.then(*registers()).then(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        h.attempt.run(h.stage)
    assert h.attempt.failure is not None and h.attempt.failure.cause is FailureCause.CANCELLED
    assert sorted(i for i, _m in h.link.sent_of(P.Cancel)) == [0, 1, 2, 3]
    assert sorted(pid for pid, _s in h.procs.signals) == [100, 101, 102, 103]
    assert h.stage.cancelled


def test_a_kill_due_at_a_checkpoint_is_fired_when_it_completes() -> None:
    h = harness(kills=(DriverKill(3, 0, None, 1, label="Kill('count[1]')"),))
    for msg in registers():
        h.attempt.on_message(msg)
    h.attempt._observe(h.clock())
    n = h.attempt.coordinator.trigger(final=False)
    for i in range(3):
        h.attempt.on_message(ack(i, n, 1, 1))
    assert h.procs.signals == []
    h.attempt.on_message(ack(3, n, 1, 1))
    assert h.procs.signals == [(103, signal.SIGKILL)]
    assert h.attempt.killed_at == 5000.0
    assert h.metrics.checkpoints_completed == 1


def test_a_task_on_another_host_is_asked_to_kill_itself() -> None:
    h = harness(kills=(DriverKill(3, 0, None, 1, label="Kill('count[1]')"),))
    for msg in registers(host="worker-2"):
        h.attempt.on_message(msg)
    h.attempt._observe(h.clock())
    n = h.attempt.coordinator.trigger(final=False)
    for i in range(4):
        h.attempt.on_message(ack(i, n, 1, 1))
    assert h.procs.signals == []  # no signal to a pid on another host
    assert h.link.sent_of(P.KillSelf) == [(3, P.KillSelf(signal.SIGKILL, "Kill('count[1]')"))]
    assert h.attempt.killed_at == 5000.0


def test_a_kill_due_by_time_waits_for_registration() -> None:
    h = harness(kills=(DriverKill(1, 0, 0.5, None, label="k"),), tick=0.1)
    h.link.then()  # 0.1 s without registrations
    h.link.then(*registers())

    def killed() -> list[P.Message]:
        if h.procs.signals:
            h.monitor.disconnect()
        return []

    for _ in range(20):
        h.link.then(killed)
    failure = h.attempt.run(h.stage)
    assert h.procs.signals[0] == (101, signal.SIGKILL)
    assert failure is not None and failure.cause is FailureCause.TASK_DIED


def test_checks_run_at_most_every_few_ms_and_checkpoints_every_turn() -> None:
    """At short intervals the loop turns once per ack: the liveness, stage, stop, fault
    and progress checks run at most every CHECKS_EVERY; the coordinator's tick (which
    triggers the next checkpoint on time) runs every turn."""
    from jobmanager.attempt import CHECKS_EVERY

    h = harness(JobConfig(checkpoint_interval=0.0005), tick=0.0005)
    counts = {"check": 0, "tick": 0}
    check, tick = h.attempt._check, h.attempt.coordinator.on_tick

    def counted_check(*args: object) -> object:
        counts["check"] += 1
        return check(*args)  # type: ignore[arg-type]

    def counted_tick() -> None:
        counts["tick"] += 1
        tick()

    h.attempt._check = counted_check  # type: ignore[method-assign,assignment]
    h.attempt.coordinator.on_tick = counted_tick  # type: ignore[method-assign]
    h.link.then(*registers())
    turns = 200

    def ack_pending() -> list[P.Message]:  # every task acks what is pending: it completes
        return [ack(i, n, n, n) for n in h.attempt.coordinator.pending for i in range(4)]

    for _ in range(1, turns):
        h.link.then(ack_pending)
    h.link.then(P.Failed(0, 0, USER, "src", 0, "E: stop here", "", False))
    assert h.attempt.run(h.stage) is not None
    span = turns * 0.0005
    assert counts["tick"] >= turns - 2
    assert counts["check"] <= span / CHECKS_EVERY + 2
    # Triggered on the turn after the last completed (acked the turn after its trigger).
    assert len(h.attempt.coordinator.completed) >= turns // 2 - 5


# -- the attempt fence ------------------------------------------------------------------------
def stale_messages(h: Harness) -> None:
    """Attempt 0's tasks 2 and 3 outlived it (behind a partition) and talk to attempt 1."""
    h.attempt.on_message(P.SinkOutput(2, 0, "out", 0, 1, [7, 7]))  # a stale commit
    h.attempt.on_message(P.Register(3, 0, "count[1]", 999, "h", "tcp://h:1"))


def test_messages_of_another_attempts_tasks_are_dropped() -> None:
    h = harness()
    h.attempt.number = 1
    stale_messages(h)
    assert h.outputs.outputs() == {"out": []} and h.attempt.registered == set()
    assert h.attempt.stale_messages == 2
    assert (
        h.attempt.on_message(
            P.Failed(3, 0, P.TaskFailureCause.USER_FUNCTION_RAISED, "count", 1, "E: x", "", False)
        )
        is None
    )


def test_companion_without_the_fence_a_stale_commit_reaches_the_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(P, "of_attempt", lambda msg, attempt: True)  # the fence off
    h = harness()
    h.attempt.number = 1
    stale_messages(h)
    assert h.outputs.outputs() == {"out": [7, 7]} and h.attempt.registered == {3}
