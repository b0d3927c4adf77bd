"""The task loop's own cost per frame: the keyed count's two tasks, in this one process,
against the same work with no runtime.

    python benchmarks/task_loop.py [--frames 4000] [--batch 1000] [--repeat 7]
        [--frames-per-turn 64] [--evict MB]

Runs `runtime.task.Task` itself (``run()``: the source loop, or the input loop's turns)
for one subtask of each of the keyed count's two steps (benchmarks/keyed_count.py, p = 2)
on in-process fakes of its sockets: a gate that hands out ready frames (at most
``--frames-per-turn`` per read; 1 is what a count task meets at steady state, where it
keeps up with its sources and wakes for each frame or two), a control socket that plays
the job manager (it triggers the final checkpoint when the source has ended and completes
every checkpoint acked), and the real `OutputChannel`s with the socket send replaced by
counting the frame. Beside each, the bare work of `benchmarks/colocation_bound.py`'s four
processes on the same records: generate, partition with `HashPartitioner` and encode
``--batch``-record frames; decode and count them. Printed: CPU µs per frame (best and
median of ``--repeat``) of each and the task's extra: what the runtime's Python path
costs per frame with no ZeroMQ and no other process. With warm caches that is a lower
bound; ``--evict MB`` writes MB of memory before each frame on both sides (the bare work
pays it too, so it cancels in the extra), which is what the three other processes of
a p = 2 job on two cores do to a task's caches between two of its frames.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import zmq
from colocation_bound import Counter, frames_of
from keyed_count import build

from channels.messages import Barrier, EndOfInput, Event, encode_data, encode_event
from channels.zmq_io import OutputChannel
from runtime import control as P
from runtime.config import JobConfig
from runtime.plan import JobPlan, TaskSpec
from runtime.task import Task
from runtime.task_environment import TaskEnvironment


class Gate:
    """Ready frames, at most ``per_turn`` per read."""

    endpoint = "fake://gate"

    def __init__(self, frames: list[bytes], per_turn: int) -> None:
        self.frames, self.per_turn, self.at = frames, per_turn, 0

    def recv_frames(self, max_frames: int) -> list[bytes]:
        EVICT[0]()
        got = self.frames[self.at : self.at + min(max_frames, self.per_turn)]
        self.at += len(got)
        return got


class JobManager:
    """The control socket: a final trigger once the source ended, every ack completed."""

    def __init__(self) -> None:
        self.inbox: deque[bytes] = deque()

    def send(self, data: bytes, /) -> None:
        msg = P.decode(data)
        if isinstance(msg, P.SourceEnded):
            self.inbox.append(P.encode(P.Trigger(1, time.time(), final=True)))
        elif isinstance(msg, P.Ack):
            self.inbox.append(P.encode(P.Complete(msg.checkpoint_id)))
        elif isinstance(msg, P.Heartbeat):
            self.inbox.append(P.encode(P.Alive()))

    def recv(self) -> bytes:
        return self.inbox.popleft()

    def poll(self, timeout: int, /) -> int:
        return len(self.inbox)

    def close(self, linger: int | None = None) -> None:
        pass


class FakeIO:
    """`runtime.task_io.TaskIO` in process; outputs are real channels that send nowhere."""

    def __init__(self, zctx: zmq.Context[Any], config: JobConfig, gate: Gate | None) -> None:
        self.zctx, self.config, self.gate = zctx, config, gate
        self.feedback_gate = self.priority_gate = None
        self.jm = JobManager()

    def control_socket(self) -> JobManager:
        return self.jm

    def output(
        self, channel: int, target: int, on_backpressure: Callable[[], None], back_edge: bool
    ) -> OutputChannel:
        cfg = self.config  # connects to a port nothing listens on: no frame leaves
        return OutputChannel(self.zctx, "tcp://127.0.0.1:9", channel, cfg.batch_size)

    refused_connections = 0  # no socket to refuse anyone

    def wait(self, timeout_ms: int) -> tuple[bool, bool]:
        gate = self.gate
        return gate is not None and gate.at < len(gate.frames), bool(self.jm.inbox)


FRAMES_SENT = [0]


def count_frame(channel: OutputChannel, frame: bytes) -> None:
    EVICT[0]()
    FRAMES_SENT[0] += 1


def nothing() -> None:
    pass


EVICT: list[Callable[[], None]] = [nothing]
"""Called once per frame on both sides (``--evict``): what other processes do to the caches."""


def evictor(megabytes: int) -> Callable[[], None]:
    """Write one byte per 64-byte cache line of a ``megabytes`` buffer."""
    buf = bytearray(megabytes << 20)
    ones = b"\x01" * (len(buf) // 64)

    def evict() -> None:
        buf[::64] = ones

    return evict


def run_task(plan: JobPlan, spec: TaskSpec, io: FakeIO) -> float:
    """CPU seconds of ``Task.run()`` (after ``open()``)."""
    env = TaskEnvironment("fake://jm", 0, io.config, None, None, None, run_id="task-loop")
    task = Task(plan, spec, env, io, "127.0.0.1")  # type: ignore[arg-type]
    try:
        task.open()
        t0 = time.process_time()
        task.run()
        return time.process_time() - t0
    finally:
        task.close(graceful=True)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--frames", type=int, default=4000, help="frames per run and side")
    ap.add_argument("--batch", type=int, default=1000, help="records per frame")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--frames-per-turn", type=int, default=64)
    ap.add_argument(
        "--evict",
        type=int,
        default=0,
        metavar="MB",
        help="before each frame, write to MB of memory (on both sides): cold caches, as "
        "when other processes ran on the core in between",
    )
    args = ap.parse_args()
    b, nf = args.batch, args.frames
    n = 2 * b * nf  # source 0's half fills ~nf frames
    config = JobConfig(batch_size=b)
    plan = build(n, 2, batch_size=b).plan()
    source = next(t for t in plan.tasks if t.task_id == "words[0]")
    count = next(t for t in plan.tasks if t.task_id == "count[0]")
    # count[0]'s input: both sources' frames for it, alternating, then the end.
    per_source = [
        list(itertools.islice((r for t, r in frames_of(i, 2 * n, b) if t == 0), nf // 2))
        for i in (0, 1)
    ]
    frames = [
        encode_data(count.inputs[i], per_source[i][j]) for j in range(nf // 2) for i in (0, 1)
    ]
    ends: list[Event] = [Barrier(1, 0.0, final=True), EndOfInput()]
    tail = [encode_event(channel, e) for e in ends for channel in count.inputs]
    OutputChannel._send = count_frame  # type: ignore[method-assign,assignment]
    if args.evict:
        EVICT[0] = evictor(args.evict)
    zctx: zmq.Context[Any] = zmq.Context()

    def source_task() -> float:
        FRAMES_SENT[0] = 0
        seconds = run_task(plan, source, FakeIO(zctx, config, None))
        return seconds / FRAMES_SENT[0]

    def source_bare() -> float:
        t0, sent = time.process_time(), 0
        evict = EVICT[0]
        for _target, records in frames_of(0, n, b):
            evict()
            encode_data(0, records)
            sent += 1
        return (time.process_time() - t0) / sent

    def count_task() -> float:
        gate = Gate(frames + tail, args.frames_per_turn)
        return run_task(plan, count, FakeIO(zctx, config, gate)) / len(frames)

    def count_bare() -> float:
        counter, evict = Counter(), EVICT[0]
        t0 = time.process_time()
        for frame in frames:
            evict()
            counter.take(frame)
        return (time.process_time() - t0) / len(frames)

    runs = {"source": (source_task, source_bare), "count": (count_task, count_bare)}
    got: dict[str, list[float]] = {f"{k} {w}": [] for k in runs for w in ("task", "bare")}
    for _ in range(args.repeat):
        for k, (task, bare) in runs.items():
            got[f"{k} task"].append(task() * 1e6)
            got[f"{k} bare"].append(bare() * 1e6)
    zctx.destroy(linger=0)
    print(
        f"\n== CPU µs per {b}-record frame, {nf} frames a run, best / median of "
        f"{args.repeat}; count task reads up to {args.frames_per_turn} frames a turn"
        + (f"; {args.evict} MB written before each frame" if args.evict else "")
        + " =="
    )
    for k in runs:
        t_us, b_us = got[f"{k} task"], got[f"{k} bare"]
        print(
            f"{k:<7} task {min(t_us):6.1f} / {statistics.median(t_us):6.1f}   "
            f"bare {min(b_us):6.1f} / {statistics.median(b_us):6.1f}   "
            f"task's extra {min(t_us) - min(b_us):5.1f} / "
            f"{statistics.median(t_us) - statistics.median(b_us):5.1f}"
        )


if __name__ == "__main__":
    main()
