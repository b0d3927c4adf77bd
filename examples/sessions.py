"""Session windows per user over click events with out-of-order and late timestamps.

    python examples/sessions.py                        # 40,000 clicks, parallelism 2
    python examples/sessions.py --kill-task sessions[1] --after chk2
    python examples/sessions.py --chaos 2              # random kills, compared with a clean run

Clicks are generated deterministically: each user is active in some 30 s epochs of
event time and silent in others (so sessions end), timestamps arrive out of order by
up to 0.4 s (below max_delay: never late), every 401st click is 90 s late (within the
allowed lateness of 150 s: it updates, merges and re-emits its session) and every
997th is 400 s late (beyond it: it goes to the late-output stream). The result is
checked against a direct sessionization of the accepted clicks, and the late stream
against the clicks made too late.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples import scaffold
from jobmanager.result import JobResult
from runtime import Dataflow
from runtime.sources import GeneratorSource
from runtime.window_kinds import Session

STEP_MS = 20  # event time between two clicks (over all users)
GAP_MS = 5_000  # a session ends after 5 s without a click
LATENESS_MS = 150_000
MAX_DELAY_MS = 1_000
BATCH = 250  # records per source batch: a watermark at least every 5 s of event time
# Late by more than a batch, a session and the gap: its session has surely fired (and
# re-emits); too late by more than that plus the lateness: surely cleaned up.
LATE_MS, TOO_LATE_MS = 90_000, 400_000


def click(i: int, users: int = 50) -> tuple[str, int, int]:
    """(user, timestamp ms, click id): deterministic, out of order, some late."""
    ts = i * STEP_MS + (i * 7919) % 400  # out of order by < 0.4 s
    epoch = ts // 30_000
    h = (i * 2654435761) % 2**32
    user = h % users
    if (user + epoch) % 3 == 0:  # this user is silent this epoch: another one clicks
        user = (user + 1) % users
    if i > 20_000 and i % 997 == 0:
        ts -= TOO_LATE_MS
    elif i > 5_000 and i % 401 == 0:
        ts -= LATE_MS
    return (f"user{user:03d}", ts, i)


def too_late(i: int) -> bool:
    return i > 20_000 and i % 997 == 0


def build(clicks: int, parallelism: int, rate: float | None, **config: Any) -> Dataflow:
    flow = Dataflow("sessions", parallelism=parallelism, batch_size=BATCH, **config)
    windows = (
        # One source subtask: the late clicks are late by construction, whatever the
        # start-up skew between source subtasks would do to the watermark (min over them).
        flow.source(GeneratorSource(click, clicks, rate=rate), name="clicks", parallelism=1)
        .assign_timestamps(lambda c: c[1], max_delay=MAX_DELAY_MS, name="event_time")
        .key_by(lambda c: c[0])
        .window(
            Session(gap=GAP_MS),
            name="sessions",
            allowed_lateness=LATENESS_MS,
            late_output="late_clicks",
            parallelism=parallelism,
        )
    )
    windows.count().collect("per_session")
    windows.late.collect("late")
    return flow


def sessionize(clicks: list[tuple[str, int, int]]) -> dict[tuple[str, int, int], int]:
    """Sessions computed directly: per user, sorted timestamps split at gaps >= GAP_MS
    (a session is [first, last + GAP_MS)); count of clicks per session."""
    by_user: dict[str, list[int]] = collections.defaultdict(list)
    for user, ts, _ in clicks:
        by_user[user].append(ts)
    out: dict[tuple[str, int, int], int] = {}
    for user, stamps in by_user.items():
        stamps.sort()
        start, last, n = stamps[0], stamps[0], 0
        for ts in stamps:
            if ts >= last + GAP_MS:
                out[(user, start, last + GAP_MS)] = n
                start, n = ts, 0
            last, n = max(last, ts), n + 1
        out[(user, start, last + GAP_MS)] = n
    return out


def check(clicks: int, emitted: list[Any], late: list[Any]) -> list[str]:
    """Problems found comparing the job's output with the direct computation."""
    problems = []
    accepted = [click(i) for i in range(clicks) if not too_late(i)]
    want = sessionize(accepted)
    last: dict[tuple[str, int, int], int] = {}
    for user, start, end, n in emitted:  # a window's last emission is its final value
        last[(user, start, end)] = n
    final = {w: n for w, n in last.items() if w in want}
    if final != want:
        missing = len(set(want) - set(final))
        wrong = sum(1 for w in final if final[w] != want[w])
        problems.append(f"{missing} sessions missing, {wrong} with a wrong count")
    stale = [w for w in last if w not in want]  # superseded by a merge: inside a final one
    for user, start, end in stale:
        if not any(u == user and s <= start and end <= e for (u, s, e) in want):
            problems.append(f"window {(user, start, end)} is in no session")
            break
    want_late = sorted(click(i) for i in range(clicks) if too_late(i))
    if sorted(tuple(r) for r in late) != want_late:
        problems.append(f"late output has {len(late)} clicks, expected {len(want_late)}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = scaffold.parser(__doc__)
    ap.add_argument("--clicks", type=int, default=40_000)
    ap.add_argument("--parallelism", type=int, default=2, help="of the session windows")
    ap.add_argument("--rate", type=float, default=10_000, help="clicks/s (0: unlimited)")
    scaffold.add_checkpoint_arguments(ap)
    return scaffold.run_example(ap, run, argv)


def outputs(result: JobResult) -> tuple[collections.Counter[Any], collections.Counter[Any]]:
    return collections.Counter(result.output("per_session")), collections.Counter(
        result.output("late")
    )


def run(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    job = scaffold.run_job(
        ap, args, lambda **config: build(args.clicks, args.parallelism, args.rate or None, **config)
    )
    result = job.result
    emitted, late = result.output("per_session"), result.output("late")
    print(
        f"\n{args.clicks:,} clicks -> {len(emitted):,} session results, {len(late)} late "
        f"clicks in {result.duration:.2f} s ({job.elapsed:.2f} s with Spark start-up)"
    )
    print(result.summary())
    problems = check(args.clicks, emitted, late)
    print(f"check against a direct sessionization: {problems or 'OK'}")
    return scaffold.verdict(job, args, not problems, outputs)


if __name__ == "__main__":
    sys.exit(main())
