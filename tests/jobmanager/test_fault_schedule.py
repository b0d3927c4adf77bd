"""The fault schedule driven by scripted run events: which driver kills are due when."""

from __future__ import annotations

from jobmanager.fault_schedule import FaultSchedule
from jobmanager.faults import DriverKill


def kill(
    task: int, attempt: int | None, seconds: float | None, checkpoint: int | None
) -> DriverKill:
    return DriverKill(task, attempt, seconds, checkpoint, label=f"kill {task}")


def test_a_timed_kill_counts_from_its_attempts_registration() -> None:
    s = FaultSchedule([kill(1, 1, 0.5, None)])
    s.start_attempt(0)
    s.on_all_registered(10.0)
    assert s.due(20.0) == []  # another attempt's
    s.start_attempt(1)
    assert s.due(30.0) == []  # not registered yet
    s.on_all_registered(30.0)
    assert s.due(30.4) == []
    assert s.due(30.5) == [kill(1, 1, 0.5, None)]
    assert s.due(31.0) == []  # fired once


def test_a_checkpoint_kill_counts_the_runs_checkpoints_and_fires_after_a_restore() -> None:
    first, second = kill(2, 0, None, 2), kill(3, 1, None, 2)
    s = FaultSchedule([first, second])
    s.start_attempt(0)
    assert s.on_checkpoint_completed(1.0, 1, final=False) == []
    assert s.on_checkpoint_completed(2.0, 2, final=False) == [first]
    s.start_attempt(1)  # restored checkpoint 2; ids go on at 3, 4, ...
    # 2 checkpoints completed in the run already: the first completion of attempt 1 fires it
    assert s.on_checkpoint_completed(3.0, 3, final=False) == [second]


def test_the_final_checkpoint_fires_nothing() -> None:
    s = FaultSchedule([kill(2, 0, None, 1)])
    s.start_attempt(0)
    assert s.on_checkpoint_completed(1.0, 0, final=True) == []
    assert "attempt 0 finished first" in s.unfired(2.0, 0)[0]


def test_a_kill_whose_task_cannot_be_killed_stays_pending() -> None:
    s = FaultSchedule([kill(2, 0, 0.1, None)])
    s.start_attempt(0)
    s.on_all_registered(0.0)
    assert s.due(1.0, can_fire=lambda i: i != 2) == []
    assert s.due(1.1) == [kill(2, 0, 0.1, None)]


def test_random_kills_are_armed_by_a_first_record_and_a_checkpoint_since_the_restore() -> None:
    k1, k2 = kill(0, None, 0.2, None), kill(3, None, 0.3, None)
    s = FaultSchedule([k1, k2])
    s.start_attempt(0)
    s.on_all_registered(0.0)
    s.on_checkpoint_completed(0.5, 1, final=False)
    assert s.due(5.0) == []  # no record processed yet
    s.on_first_record(5.0)  # armed now: a checkpoint completed in this attempt
    assert s.due(5.1) == []
    assert s.due(5.2) == [k1]
    assert s.due(9.0) == []  # one random kill per attempt
    s.start_attempt(1)
    s.on_all_registered(10.0)
    s.on_first_record(10.5)
    assert s.due(12.0) == []  # no checkpoint since the restore yet
    s.on_checkpoint_completed(12.0, 2, final=False)
    assert s.due(12.2) == []
    assert s.due(12.3) == [k2]
    assert s.unfired(20.0, 2) == []


def test_unfired_kills_say_why() -> None:
    ks = [kill(0, 0, 9.0, None), kill(1, 2, 1.0, None), kill(2, None, 0.1, None)]
    s = FaultSchedule(ks)
    s.start_attempt(0)
    s.on_all_registered(0.0)
    s.start_attempt(1)  # attempt 0 failed otherwise before its kill was due
    s.on_all_registered(10.0)
    notes = s.unfired(12.5, 3)
    assert notes[0] == "kill 0: attempt 0 failed before it was due"
    assert notes[1] == "kill 1: the job finished in attempt 1"
    assert "not armed" in notes[2] and "3 checkpoint(s) completed in the run" in notes[2]


def test_an_attempt_about_to_finish_gets_its_random_kill_at_once() -> None:
    k1, k2, k3 = (kill(i, None, 0.4, None) for i in range(3))
    s = FaultSchedule([k1, k2, k3])
    s.start_attempt(0)
    s.on_first_record(1.0)  # no checkpoint since the restore: not armed
    assert s.due(9.0) == []
    assert s.on_sources_ended(False) == [k1]  # the attempt is about to finish: now
    assert s.on_sources_ended(False) == []  # one per attempt
    s.start_attempt(1)
    assert s.on_sources_ended(False, can_fire=lambda i: i != 1) == []  # its task not registered yet
    assert s.due(10.0, can_fire=lambda i: i != 1) == []
    assert s.due(10.1) == [k2]  # as soon as it can be killed
    s.start_attempt(2)
    s.on_first_record(11.0)
    s.on_checkpoint_completed(11.5, 2, final=False)
    assert s.due(11.9) == [k3]
    assert s.on_sources_ended(False) == []
    assert s.unfired(12.0, 2) == []


def test_an_ending_attempts_kill_waits_for_its_pending_periodic_checkpoint() -> None:
    k = kill(2, None, 5.0, None)
    s = FaultSchedule([k])
    s.start_attempt(0)
    s.on_first_record(1.0)
    assert s.on_sources_ended(True) == []  # checkpoint 1 is still on its way
    assert s.due(1.5, periodic_pending=True) == []
    assert s.on_checkpoint_completed(2.0, 1, final=False) == [k]  # restored from it


def test_an_ending_attempt_whose_periodic_checkpoint_failed_gets_its_kill() -> None:
    k = kill(2, None, 5.0, None)
    s = FaultSchedule([k])
    s.start_attempt(0)
    assert s.on_sources_ended(True) == []
    assert s.due(3.0, periodic_pending=False) == [k]  # it was aborted: no reason to wait


def test_a_superstep_kill_fires_as_that_superstep_or_a_later_one_starts() -> None:
    first = DriverKill(1, 0, None, None, label="a", after_superstep=4)
    second = DriverKill(2, 1, None, None, label="b", after_superstep=3)
    s = FaultSchedule([first, second])
    s.start_attempt(0)
    assert s.on_superstep(3) == []
    assert s.on_superstep(4, can_fire=lambda i: False) == []  # not killable now
    assert s.on_superstep(5) == [first]
    s.start_attempt(1)  # restored after superstep 4: superstep 3 never starts again
    assert s.on_superstep(5) == [second] and s.on_superstep(6) == []
