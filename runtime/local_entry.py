"""A task process of the local launcher (``jobmanager.local_launcher``): no Spark, no JVM.

    python -m runtime.local_entry INDEX FD

(or forked by the fork server, ``runtime.fork_entry``, which has imported this already)

The job manager writes the attempt (``cloudpickle`` of ``(plan, env)``, length-prefixed)
to the process's stdin; the task binds its gates on 127.0.0.1, writes its endpoints as
one JSON line to FD, reads every task's endpoints (a JSON list, one line) from stdin,
and runs (``runtime.task_entry.run_task``). The job manager keeps stdin open while the
attempt runs: end of file before the task is done means the job manager is gone (or
ended the attempt), and the task process ends itself at once (no orphan survives a
killed driver). A task that is done waits for that end of file before it exits, as a
pooled Spark worker outlives its task: its last messages (Finished, Closed) are read by
the job manager before its connections drop (an exiting process may reset them).
"""

from __future__ import annotations

import json
import os
import signal
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, BinaryIO

HOST = "127.0.0.1"
LENGTH = struct.Struct("!Q")


def read_attempt(stream: BinaryIO) -> bytes:
    """The length-prefixed payload the job manager wrote."""
    (size,) = LENGTH.unpack(_read_exactly(stream, LENGTH.size))
    return _read_exactly(stream, size)


def _read_exactly(stream: BinaryIO, size: int) -> bytes:
    data = stream.read(size)
    if data is None or len(data) != size:
        raise EOFError("the job manager closed the task's stdin before sending the attempt")
    return data


class Watchdog:
    """Reads stdin to its end (a thread): before the task is done, the end kills the
    process; after, it lets the process exit."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.done = threading.Event()
        self.released = threading.Event()
        self.started = False
        self.before_kill: Callable[[], None] | None = None  # last words (a profile)

    def start(self) -> None:
        self.started = True
        threading.Thread(target=self._watch, name="absflow-watchdog", daemon=True).start()

    def _watch(self) -> None:
        while self.stream.read(4096):
            pass
        if not self.done.is_set():
            if self.before_kill is not None:
                self.before_kill()
            os.kill(os.getpid(), signal.SIGKILL)
        self.released.set()

    def exit_when_released(self, timeout: float | None = None) -> None:
        """The task is done: wait (up to ``timeout``) until the job manager releases it."""
        self.done.set()
        if self.started:
            self.released.wait(timeout)


def profile_task(
    plan: Any,
    env: Any,
    index: int,
    exchange: Callable[[str], list[str]],
    watchdog: Watchdog,
    profile_dir: str,
) -> None:
    """Run the task under cProfile (CPU time: robust to other load on the machine) and
    write ``task-<index>-<pid>.prof`` into ``profile_dir``, also when the job manager
    releases the process before the task returned (its last message is sent early)."""
    import cProfile

    from runtime.task_entry import run_task

    prof = cProfile.Profile(time.process_time)
    path = os.path.join(profile_dir, f"task-{index}-{os.getpid()}.prof")
    claimed, written = threading.Lock(), threading.Event()

    def dump() -> None:  # once, by whichever thread comes first; the other waits for it
        if claimed.acquire(blocking=False):
            prof.dump_stats(path)
            written.set()
        else:
            written.wait(10.0)

    watchdog.before_kill = dump
    prof.enable()
    try:
        run_task(plan, env, index, HOST, exchange)
    finally:
        prof.disable()
        dump()


# A task that failed has reported why (Failed): the job manager ends the attempt on that
# report. The process waits this long for it before it exits with an error anyway.
FAILED_GRACE = 2.0


def main(argv: list[str], watchdog: Watchdog) -> int:
    import cloudpickle

    from runtime.task_entry import run_task

    index, fd = int(argv[0]), int(argv[1])
    stdin = watchdog.stream
    plan, env = cloudpickle.loads(read_attempt(stdin))
    out = os.fdopen(fd, "wb", buffering=0)

    def exchange(message: str) -> list[str]:
        out.write(message.encode() + b"\n")
        out.close()
        line = stdin.readline()
        if not line:
            raise EOFError("the job manager closed the task's stdin during the endpoint exchange")
        watchdog.start()
        peers: list[str] = json.loads(line)
        return peers

    profile_dir = os.environ.get("ABSFLOW_PROFILE_DIR")
    if profile_dir:  # a development tool: a cProfile (CPU time) of this task
        profile_task(plan, env, index, exchange, watchdog, profile_dir)
    else:
        run_task(plan, env, index, HOST, exchange)
    watchdog.exit_when_released()
    return 0


def run_process(argv: list[str], stdin: BinaryIO) -> None:
    """The whole life of a task process (``python -m runtime.local_entry``, or a child of
    the fork server, ``runtime.fork_entry``): never returns."""
    dog = Watchdog(stdin)
    try:
        code = main(argv, dog)
    except BaseException:  # the task reported what it could; the job manager sees the exit
        traceback.print_exc()
        dog.exit_when_released(FAILED_GRACE)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # threads of a failed task (zmq, writers) must not hold the exit


if __name__ == "__main__":
    run_process(sys.argv[1:], sys.stdin.buffer)
