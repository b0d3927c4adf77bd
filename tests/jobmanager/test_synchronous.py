"""Naiad-style synchronous checkpoints in the coordinator, scripted: halt every source,
drain (four-counter waves over every task), then trigger; the sources resume when the
checkpoint completes or aborts."""

from __future__ import annotations

from pathlib import Path

from runtime import control as P
from runtime.control import CheckpointFailureReason
from tests.jobmanager.test_coordinator import ALL, SOURCES, Harness, of_type, triggers


def probes(sent: list[tuple[int, P.Message]]) -> list[tuple[int, int, int]]:
    return [(i, m.round, m.tag) for i, m in sent if isinstance(m, P.LoopProbe)]


def answer(h: Harness, counts: dict[int, tuple[int, int]], tag: int = 1) -> None:
    """Every task answers the current wave with its (sent, received)."""
    drain = h.coord.pending[tag].drain
    assert drain is not None
    for index, (sent, received) in counts.items():
        h.coord.on_status(P.LoopStatus(index, 0, drain.round, sent, received, tag))


BALANCED = {0: (50, 0), 1: (50, 0), 2: (0, 60), 3: (0, 40)}


def test_halts_every_source_then_drains_then_triggers(tmp_path: Path) -> None:
    h = Harness(tmp_path, snapshot_mode="synchronous")
    sent = h.tick(10.0)
    assert of_type(sent, P.Halt) == [(i, P.Halt(1)) for i in ALL]  # timers halt too
    assert triggers(sent) == []  # nothing is snapshotted before the job drained
    assert probes(h.tick()) == [(i, 1, 1) for i in ALL]  # a wave over every task
    answer(h, {0: (50, 0), 1: (50, 0), 2: (0, 60), 3: (0, 30)})  # 10 still in flight
    assert triggers(h.tick()) == []
    answer(h, BALANCED)
    assert triggers(h.tick()) == []  # one balanced wave proves nothing yet
    answer(h, BALANCED)
    sent = h.tick(0.01)
    assert triggers(sent) == [(0, 1, False), (1, 1, False)]
    h.sent.new()
    done = h.ack(1)
    assert done is not None
    # Every task halted: every task hears that it completed (and resumes).
    assert of_type(h.sent.new(), P.Complete) == [(i, P.Complete(1)) for i in ALL]
    halt_ms, drain_ms = done.metrics.halt_ms, done.metrics.drain_ms
    assert halt_ms is not None and drain_ms is not None and halt_ms >= drain_ms > 0
    per_task = h.storage.read_metadata(1).task_metrics
    assert per_task["count[0]"].drained_received == 60
    assert per_task["src[1]"].drained_sent == 50


def test_waves_of_another_tag_or_round_do_not_count(tmp_path: Path) -> None:
    h = Harness(tmp_path, snapshot_mode="synchronous")
    h.tick(10.0)
    h.tick()
    for _ in range(3):  # termination's waves (tag 0) are not this checkpoint's
        for index, (s, r) in BALANCED.items():
            h.coord.on_status(P.LoopStatus(index, 0, 1, s, r, 0))
        assert triggers(h.tick(0.01)) == []


def test_a_job_that_never_drains_expires_and_the_sources_resume(tmp_path: Path) -> None:
    h = Harness(tmp_path, snapshot_mode="synchronous", checkpoint_timeout=5.0)
    h.tick(10.0)
    h.tick()
    answer(h, {0: (50, 0), 1: (50, 0), 2: (0, 60), 3: (0, 30)})
    h.tick(5.1)
    assert not h.coord.pending
    assert h.coord.failed[-1].reason is CheckpointFailureReason.EXPIRED
    aborts = of_type(h.sent.log, P.Abort)
    assert sorted(i for i, _ in aborts) == ALL  # the halted sources are released


def test_the_sources_ending_while_halted_subsume_it_with_the_final_checkpoint(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path, snapshot_mode="synchronous")
    h.tick(10.0)
    h.coord.on_sources_ended()
    sent = h.sent.new()
    assert h.coord.failed[-1].reason is CheckpointFailureReason.SUBSUMED
    assert triggers(sent) == [(i, 2, True) for i in SOURCES]  # final: aligned as always


def test_debug_skip_drain_triggers_at_the_halt(tmp_path: Path) -> None:
    h = Harness(tmp_path, snapshot_mode="synchronous", debug_skip_drain=True)
    sent = h.tick(10.0)
    assert of_type(sent, P.Halt) and triggers(sent) == [(0, 1, False), (1, 1, False)]


def test_other_modes_never_halt(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    sent = h.tick(10.0)
    assert of_type(sent, P.Halt) == [] and triggers(sent)
