"""When the job manager's own kills are due (``DriverKill``s resolved by
``jobmanager.faults``), over a whole run: the schedule is told what happens (an attempt
starts, its tasks registered, its first record, a checkpoint completed) and answers
which kills are due now. Firing them is the attempt's business.

Driver side, job-manager thread only; time comes in as arguments (monotonic seconds),
so the schedule is tested with scripted events.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence

from jobmanager.faults import DriverKill

log = logging.getLogger("absflow.jobmanager")


class FaultSchedule:
    """Due kills of a run.

    * ``Kill(after_seconds=s, attempt=a)``: due ``s`` after every task of attempt ``a``
      registered.
    * ``Kill(after_checkpoint=n, attempt=a)``: due in attempt ``a`` when a (non-final)
      checkpoint completes and ``n`` or more checkpoints completed in the run.
    * ``Kill(after_superstep=k, attempt=a)``: due in attempt ``a`` as an iteration starts
      superstep ``k`` or a later one.
    * Random kills (``attempt`` None), one at a time in order: armed once the running
      attempt processed its first record and completed a checkpoint since its restore;
      due ``after_seconds`` after that. An attempt about to finish (its sources ended)
      that has not had its random kill gets it at once (after a periodic checkpoint
      still pending, as soon as its task can be killed): a short job's attempt may end
      before any checkpoint of its own; it is then restored from the run's latest
      checkpoint, or from the start when the job outran every periodic checkpoint. At most one random kill fires per attempt (it
      fails the attempt).

    A kill whose task cannot be killed right now (``can_fire(task_index)`` False, e.g.
    the task finished) stays pending; whatever never fired is reported by ``unfired``.
    """

    def __init__(self, kills: Sequence[DriverKill]) -> None:
        self.planned = [k for k in kills if k.attempt is not None]
        self.random: deque[DriverKill] = deque(k for k in kills if k.attempt is None)
        self.missed: list[str] = []  # kills whose attempt failed before they were due
        self.attempt = -1
        self.registered_at: float | None = None
        self.first_record = False
        self.checkpoints_in_attempt = 0
        self.armed_at: float | None = None
        self.random_fired_in_attempt = False
        self.ending = False  # the running attempt's sources ended

    # -- events ----------------------------------------------------------------------------
    def start_attempt(self, number: int) -> None:
        """Attempt ``number`` is submitted (attempts are numbered 0, 1, ... in order)."""
        for k in [k for k in self.planned if k.attempt is not None and k.attempt < number]:
            self.planned.remove(k)
            self.missed.append(f"{k.label}: attempt {k.attempt} failed before it was due")
        self.attempt = number
        self.registered_at = None
        self.first_record = False
        self.checkpoints_in_attempt = 0
        self.armed_at = None
        self.random_fired_in_attempt = False
        self.ending = False

    def on_all_registered(self, now: float) -> None:
        self.registered_at = now

    def on_first_record(self, now: float) -> None:
        self.first_record = True
        self._arm(now)

    def on_checkpoint_completed(
        self,
        now: float,
        completed_in_run: int,
        final: bool,
        can_fire: Callable[[int], bool] = lambda _i: True,
    ) -> list[DriverKill]:
        """A checkpoint completed; ``completed_in_run`` counts the non-final ones of the
        run so far (this one included). Returns the kills due now (removed from the
        schedule)."""
        if final:
            return []
        self.checkpoints_in_attempt += 1
        self._arm(now)
        due = [
            k
            for k in self.planned
            if k.attempt == self.attempt
            and k.after_checkpoint is not None
            and completed_in_run >= k.after_checkpoint
            and can_fire(k.task_index)
        ]
        for k in due:
            self.planned.remove(k)
        if self.ending:  # the checkpoint an ending attempt's random kill waited for
            due += self._random_due(now, can_fire, ending=True)
        return due

    def on_superstep(
        self, superstep: int, can_fire: Callable[[int], bool] = lambda _i: True
    ) -> list[DriverKill]:
        """An iteration starts ``superstep`` in the running attempt: the kills due as it
        starts (``after_superstep`` reached: at it, or the first superstep after it an
        attempt restored past it runs). Returns them (removed from the schedule)."""
        due = [
            k
            for k in self.planned
            if k.attempt == self.attempt
            and k.after_superstep is not None
            and superstep >= k.after_superstep
            and can_fire(k.task_index)
        ]
        for k in due:
            self.planned.remove(k)
        return due

    def on_sources_ended(
        self, periodic_pending: bool, can_fire: Callable[[int], bool] = lambda _i: True
    ) -> list[DriverKill]:
        """Every source of the attempt read its input (the final checkpoint starts): the
        attempt is about to finish, its random kill is due at once, or, while a periodic
        checkpoint is still pending (``periodic_pending``), as soon as that completes.
        Returns the kills due now (removed from the schedule)."""
        self.ending = True
        return [] if periodic_pending else self._random_due(0.0, can_fire, ending=True)

    def due(
        self,
        now: float,
        can_fire: Callable[[int], bool] = lambda _i: True,
        periodic_pending: bool = False,
    ) -> list[DriverKill]:
        """Kills due now (removed from the schedule); ``periodic_pending``: a non-final
        checkpoint of the attempt is pending (an ending attempt's kill waits for it)."""
        due: list[DriverKill] = []
        if self.registered_at is not None:
            due = [
                k
                for k in self.planned
                if k.attempt == self.attempt
                and k.after_seconds is not None
                and now - self.registered_at >= k.after_seconds
                and can_fire(k.task_index)
            ]
            for k in due:
                self.planned.remove(k)
        return due + self._random_due(now, can_fire, ending=self.ending and not periodic_pending)

    def _random_due(
        self, now: float, can_fire: Callable[[int], bool], ending: bool
    ) -> list[DriverKill]:
        if not self.random or self.random_fired_in_attempt:
            return []
        k = self.random[0]
        timed_out = self.armed_at is not None and now - self.armed_at >= (k.after_seconds or 0.0)
        if not (ending or timed_out) or not can_fire(k.task_index):
            return []
        self.armed_at = None
        self.random_fired_in_attempt = True
        return [self.random.popleft()]

    def _arm(self, now: float) -> None:
        if (
            self.random
            and self.armed_at is None
            and not self.random_fired_in_attempt
            and self.first_record
            and self.checkpoints_in_attempt > 0
        ):
            self.armed_at = now
            log.info(
                "fault injection: %s armed, due in %.2f s",
                self.random[0].label,
                self.random[0].after_seconds or 0.0,
            )

    # -- the end ---------------------------------------------------------------------------
    def unfired(self, now: float, completed_in_run: int) -> list[str]:
        """Why each kill that never fired did not, when the run ended successfully in the
        current attempt at ``now``; ``completed_in_run`` as in on_checkpoint_completed."""
        notes = list(self.missed)
        since = (
            f"{now - self.registered_at:.2f} s after all its tasks registered"
            if self.registered_at is not None
            else "before all its tasks registered"
        )
        checkpoints = f"{completed_in_run} checkpoint(s) completed in the run"
        for k in self.planned:
            if k.attempt == self.attempt:
                notes.append(
                    f"{k.label}: attempt {k.attempt} finished first, {since}, {checkpoints}"
                )
            else:
                notes.append(f"{k.label}: the job finished in attempt {self.attempt}")
        for i, k in enumerate(self.random):
            if i == 0 and self.armed_at is not None:
                state = f"armed {now - self.armed_at:.2f} s before the end"
            elif i == 0 and not self.random_fired_in_attempt:
                state = "not armed: no checkpoint completed since the last restore"
            else:
                state = "not reached"
            notes.append(
                f"{k.label}: the job finished first in attempt {self.attempt} ({state}), {checkpoints}"
            )
        return notes
