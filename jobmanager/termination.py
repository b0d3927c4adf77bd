"""Quiescence by Mattern's four-counter method: exact termination of bounded jobs with
loops, and the drain before a synchronous (Naiad-style) checkpoint.

Once every source has ended no new record can enter the job, but records may
still circulate in a loop, for ever or for thousands of rounds. The job manager
probes every task in waves; a task answers with the records it has *sent* on its
output channels and *received* (processed) from its input channels in this
attempt. Records inside a task (blocked buffers, the feedback queue, partial
output batches) count as sent and not yet received. Two consecutive complete waves
with ``sent == received`` and the same totals prove that nothing was in flight
between them: the loop is empty and stays empty (the sources have ended). Only
then does the final checkpoint start. Never a timeout, never an idle period.

The same waves prove a job drained before a synchronous checkpoint: every source is
halted, so once two waves agree nothing is in flight on any channel and every task
can snapshot (``tag`` = the checkpoint id keeps those waves apart from termination's).

Driver side, job-manager thread only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from runtime import control as P

log = logging.getLogger("absflow.jobmanager")


@dataclass(frozen=True, slots=True)
class Wave:
    """The totals of one complete probe wave."""

    round: int
    sent: int
    received: int

    @property
    def balanced(self) -> bool:
        return self.sent == self.received


class LoopTermination:
    """Decides when a job with loops has no record left anywhere.

    ``start()`` once every source ended; then ``on_tick()`` sends waves of
    ``LoopProbe`` (a new wave once the previous one is complete and ``interval``
    has passed) and ``on_status()`` takes the answers. ``terminated`` becomes True
    once proven; it never goes back.
    """

    def __init__(
        self,
        tasks: list[int],
        send: Callable[[int, P.Message], None],
        interval: float = 0.005,
        clock: Callable[[], float] = time.monotonic,
        tag: int = 0,
    ) -> None:
        self.tasks = list(tasks)
        self.tag = tag
        self.send = send
        self.interval = interval
        self.resend_after = 1.0
        self.clock = clock
        self.started = False
        self.terminated = False
        self.round = 0
        self.answers: dict[int, P.LoopStatus] = {}
        self.waves: list[Wave] = []
        self.wave_sent_at = -float("inf")
        self.last_answers: dict[int, P.LoopStatus] = {}
        """The answers of the last complete wave (once ``terminated``: the proof's)."""

    def start(self) -> None:
        """Every source ended; the first wave goes out at the next ``on_tick`` (called
        once every task registered: a probe to an unregistered task would be lost)."""
        if not self.started:
            self.started = True
            log.info("every source ended: detecting when no record is left in the loops")

    def on_status(self, status: P.LoopStatus) -> None:
        if status.round == self.round and status.tag == self.tag and not self.terminated:
            self.answers[status.task_index] = status

    def on_tick(self) -> bool:
        """Advance the detection; True once the job is proven to have no record left."""
        if not self.started or self.terminated:
            return self.terminated
        if len(self.answers) == len(self.tasks):
            wave = Wave(
                self.round,
                sum(a.sent for a in self.answers.values()),
                sum(a.received for a in self.answers.values()),
            )
            self.waves.append(wave)
            self.last_answers = self.answers
            if len(self.waves) % 100 == 1:
                log.info(
                    "termination wave %d: sent %d, received %d",
                    wave.round,
                    wave.sent,
                    wave.received,
                )
            previous = self.waves[-2] if len(self.waves) > 1 else None
            if (
                previous is not None
                and previous.balanced
                and wave.balanced
                and (previous.sent, previous.received) == (wave.sent, wave.received)
            ):
                self.terminated = True
                return True
            self.answers = {}
            self.round = 0  # no answer counts until the next wave is out
        now = self.clock()
        if self.round == 0 and now - self.wave_sent_at >= self.interval:
            self._probe()
        elif self.round and now - self.wave_sent_at >= self.resend_after:
            # A probe can be lost (a task reconnecting its control socket): ask again.
            self.wave_sent_at = now
            for index in self.tasks:
                if index not in self.answers:
                    self.send(index, P.LoopProbe(self.round, self.tag))
        return False

    @property
    def in_flight(self) -> int | None:
        """Records sent but not yet received at the last complete wave (for progress)."""
        return self.waves[-1].sent - self.waves[-1].received if self.waves else None

    def _probe(self) -> None:
        self.round = len(self.waves) + 1
        self.answers = {}
        self.wave_sent_at = self.clock()
        for index in self.tasks:
            self.send(index, P.LoopProbe(self.round, self.tag))
