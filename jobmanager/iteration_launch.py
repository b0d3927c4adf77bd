"""Where an iteration's tasks run: a Spark barrier stage (one Python worker per
partition, endpoints exchanged through the driver's rendezvous,
``channels.rendezvous``) or threads of the driver (tests
and benchmarks without Spark; a "kill" then ends the thread abruptly, sockets closed
without a word, which is what the others see of a SIGKILLed process).

Both report the same way: ``failure()`` is None while every task runs or ended
normally, else a one-line reason.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import threading
from dataclasses import replace
from typing import Any

from channels.rendezvous import Rendezvous, gather
from channels.zmq_io import host_of
from runtime.iterations.api import IterationSpec
from runtime.iterations.worker import WorkerContext, run_worker

__all__ = ["SparkLauncher", "ThreadLauncher"]


class SimulatedKill(BaseException):
    """A thread task's SIGKILL (BaseException: no handler in the task catches it)."""


class ThreadLauncher:
    def __init__(self, spec: IterationSpec, contexts: list[WorkerContext]) -> None:
        n = len(contexts)
        self._endpoints: list[str] = [""] * n
        self._barrier = threading.Barrier(n)
        self._failures: queue.Queue[str] = queue.Queue()
        self._threads = [
            threading.Thread(
                target=self._run, args=(spec, c), name=f"iter-task-{c.index}", daemon=True
            )
            for c in contexts
        ]

    def start(self) -> ThreadLauncher:
        for t in self._threads:
            t.start()
        return self

    def _run(self, spec: IterationSpec, wctx: WorkerContext) -> None:
        def exchange(endpoint: str) -> list[str]:
            self._endpoints[wctx.index] = endpoint
            self._barrier.wait()
            return list(self._endpoints)

        def die(sig: int) -> None:
            raise SimulatedKill(f"task {wctx.index} killed (signal {sig})")

        try:
            run_worker(spec, wctx, exchange, die)
        except SimulatedKill as err:
            self._failures.put(str(err))
        except BaseException as err:
            self._failures.put(f"task {wctx.index} crashed: {err!r}")

    def failure(self) -> str | None:
        try:
            return self._failures.get_nowait()
        except queue.Empty:
            return None

    def cancel(self) -> None:
        """Threads end on the job manager's Cancel; nothing else to do."""

    def join(self, timeout: float) -> bool:
        for t in self._threads:
            t.join(timeout)
        return not any(t.is_alive() for t in self._threads)


class SparkLauncher:
    """One barrier stage per attempt, run as a result stage in a driver thread."""

    def __init__(self, spark: Any, spec: IterationSpec, contexts: list[WorkerContext]) -> None:
        self.sc = spark.sparkContext
        self.group = f"absflow-iter-{spec.name}-{contexts[0].attempt}-{os.getpid()}"
        self._outcome: queue.Queue[str | None] = queue.Queue()
        self._done = False
        self._thread = threading.Thread(target=self._run, args=(spec, contexts), daemon=True)

    def start(self) -> SparkLauncher:
        self._thread.start()
        return self

    def _run(self, spec: IterationSpec, contexts: list[WorkerContext]) -> None:
        from jobmanager.launcher import describe_stage_error

        n = len(contexts)
        try:
            with Rendezvous(host_of(contexts[0].jm_endpoint), n) as rendezvous:
                meet = rendezvous.endpoint

                def entry(_: Any) -> Any:
                    from runtime.task_entry import barrier_task_address

                    index, host = barrier_task_address()

                    def die(sig: int) -> None:
                        os.kill(os.getpid(), sig)

                    exchange = functools.partial(gather, meet, index)
                    run_worker(spec, replace(contexts[index], host=host), exchange, die)
                    return [index]

                self.sc.setJobGroup(self.group, f"absflow iteration '{spec.name}'", True)
                self.sc.parallelize(range(n), n).barrier().mapPartitions(entry).collect()
            self._outcome.put(None)
        except BaseException as err:
            self._outcome.put(describe_stage_error(err))

    def failure(self) -> str | None:
        if self._done:
            return None
        try:
            reason = self._outcome.get_nowait()
        except queue.Empty:
            return None
        self._done = True
        return reason

    def cancel(self) -> None:
        with contextlib.suppress(Exception):
            self.sc.cancelJobGroup(self.group)

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()
