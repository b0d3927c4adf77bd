"""The local launcher: every task of an attempt is a local Python process, started by
the job manager without Spark or a JVM (``runtime.local_entry``). The test harness
(``runtime.api.testing``) runs on it; the job manager sees it only as a `Launcher`.

The endpoint exchange Spark does with ``allGather`` is done over pipes: each task
writes its endpoints to its own pipe, the stage's thread gathers them and writes the
list to every task's stdin. Processes run in their own session (a Ctrl-C reaches the
job manager, which cancels them) and end themselves when the job manager is gone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any, Protocol

import cloudpickle

from jobmanager.fork_server import ForkServerError, dumps_naming_modules, fork_server
from jobmanager.launcher import task_pythonpath
from runtime.config import JobConfig
from runtime.errors import GraphError
from runtime.local_entry import HOST, LENGTH
from runtime.plan import JobPlan
from runtime.task_environment import TaskEnvironment

log = logging.getLogger("absflow.launcher")

__all__ = ["LocalProcessLauncher", "LocalStage", "TaskExited"]

PRELOAD_VAR = "ABSFLOW_FORK_PRELOAD"
POLL_SECONDS = 0.01
CLOSE_SECONDS = 10.0
# Settings only a Spark session can honour, with their defaults.
SPARK_ONLY = {"local_master": None, "executor_wait": JobConfig().executor_wait}


def preloads(config: JobConfig) -> bool:
    """``config.fork_preload``, else ``$ABSFLOW_FORK_PRELOAD`` is 1."""
    if config.fork_preload is not None:
        return config.fork_preload
    return os.environ.get(PRELOAD_VAR, "").strip().lower() in ("1", "true", "yes")


class TaskProcess(Protocol):
    """A task process: a ``subprocess.Popen`` or a `ForkedTask` of the fork server."""

    pid: int
    stdin: IO[bytes] | None
    returncode: Any

    def poll(self) -> int | None: ...

    def kill(self) -> None: ...


class TaskExited(RuntimeError):
    """A task process of the local launcher ended with an error or a signal. The text
    matches the stage errors ``jobmanager.failures.classify_stage_error`` knows."""


class LocalProcessLauncher:
    """Tasks as local processes, one per task, started afresh for every attempt."""

    name = "local"

    def __init__(self) -> None:
        self.host = HOST
        self.local_hosts = {HOST, "localhost"}
        self.remote = False
        self.stages: list[LocalStage] = []

    @property
    def refused_connections(self) -> int:
        """The exchange goes over pipes: no socket of its own to refuse anyone."""
        return 0

    def prepare(self, tasks: int, config: JobConfig, say: Callable[[str], None]) -> None:
        check_config(config)

    def before_restart(self, tasks: int, config: JobConfig, say: Callable[[str], None]) -> None:
        """Local processes need no slots."""

    def start(self, plan: JobPlan, env: TaskEnvironment, group: str) -> LocalStage:
        stage = LocalStage(plan, env, group).start()
        self.stages.append(stage)
        return stage

    def close(self) -> None:
        """No task process outlives the run: each stage's are released, and ended if
        they do not exit within CLOSE_SECONDS (a stage reaps its own processes)."""
        for stage in self.stages:
            if not stage.join(CLOSE_SECONDS):
                log.warning("task processes of %s did not exit; ending them", stage.group)
                stage.cancel()
                stage.join(CLOSE_SECONDS)
        self.stages.clear()


def check_config(config: JobConfig) -> None:
    """GraphError for a setting the local launcher cannot honour (a Spark option)."""
    for name, default in SPARK_ONLY.items():
        value = getattr(config, name)
        if value != default:
            raise GraphError(
                f"{name}={value!r} is a Spark setting, and the local launcher runs no Spark: "
                f"drop {name}, or run on Spark (launcher='spark')."
            )


class LocalStage:
    """One attempt's task processes; ``outcome`` gets None once all exited cleanly, or
    a TaskExited as soon as one ended with an error or a signal (like a failed barrier
    stage). ``cancel`` ends the processes still running; ``join`` waits for the reaping."""

    def __init__(self, plan: JobPlan, env: TaskEnvironment, group: str) -> None:
        self.plan, self.env, self.group = plan, env, group
        self.outcome: queue.Queue[BaseException | None] = queue.Queue()
        self.procs: list[TaskProcess] = []
        self._lock = threading.Lock()
        self._cancelled = False
        self.thread = threading.Thread(
            target=self._run, name=f"absflow-local-{env.attempt}", daemon=True
        )

    def start(self) -> LocalStage:
        self.thread.start()
        return self

    # -- the stage thread ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            readers = self._spawn()
            self._exchange(readers)
            self._reap()
        except BaseException as err:  # reported to the job manager thread
            self.outcome.put(err)
            self.cancel()
            self._reap(report=False)

    def _spawn(self) -> list[IO[bytes]]:
        config = self.env.config
        env = dict(os.environ, PYTHONPATH=task_pythonpath())
        modules: set[str] | None = None  # None: a server that does not preload
        if config.fork_server and preloads(config):
            payload, modules = dumps_naming_modules((self.plan, self.env))
        else:
            payload = cloudpickle.dumps((self.plan, self.env))
        server = fork_server(env["PYTHONPATH"], modules) if config.fork_server else None
        readers: list[IO[bytes]] = []
        for spec in self.plan.tasks:
            r, w = os.pipe()
            try:
                with self._lock:
                    if self._cancelled:
                        raise TaskExited(f"attempt {self.env.attempt} was cancelled")
                    proc: TaskProcess | None = None
                    if server is not None:
                        try:
                            proc = server.spawn(spec.index, w, env)
                        except (OSError, ForkServerError) as err:
                            log.warning("task processes start afresh: %s", err)
                            server = None
                    if proc is None:
                        proc = subprocess.Popen(
                            [sys.executable, "-m", "runtime.local_entry", str(spec.index), str(w)],
                            stdin=subprocess.PIPE,
                            pass_fds=(w,),
                            env=env,
                            start_new_session=True,
                        )
                    self.procs.append(proc)
            finally:
                os.close(w)
            readers.append(os.fdopen(r, "rb"))
            assert proc.stdin is not None
            proc.stdin.write(LENGTH.pack(len(payload)) + payload)
            proc.stdin.flush()
        return readers

    def _exchange(self, readers: list[IO[bytes]]) -> None:
        """allGather over pipes: every task's endpoints, in task order, to every task."""
        messages = []
        for spec, reader in zip(self.plan.tasks, readers, strict=True):
            with reader:
                line = reader.readline()
            if not line:
                raise TaskExited(
                    f"task process {spec.task_id} exited unexpectedly before the endpoint "
                    f"exchange ({self._exit_words(self.procs[spec.index])})"
                )
            messages.append(line.decode().strip())
        gathered = (json.dumps(messages) + "\n").encode()
        for proc in self.procs:
            assert proc.stdin is not None
            try:
                proc.stdin.write(gathered)
                proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                pass  # gone already: the wait below reports it

    def _reap(self, report: bool = True) -> None:
        """Wait until every process exited; report the first that failed at once."""
        running = list(zip(self.plan.tasks, self.procs, strict=False))
        failed = False
        while running:
            for spec, proc in list(running):
                code = proc.poll()
                if code is None:
                    continue
                running.remove((spec, proc))
                self._close_stdin(proc)
                if code != 0 and report and not failed:
                    failed = True
                    self.outcome.put(TaskExited(self._failure_text(spec.task_id, proc)))
            if running:
                time.sleep(POLL_SECONDS)
        if report and not failed:
            self.outcome.put(None)

    def _failure_text(self, task_id: str, proc: TaskProcess) -> str:
        if proc.returncode < 0:
            return f"task process {task_id} (pid {proc.pid}) exited unexpectedly: " + (
                self._exit_words(proc)
            )
        return f"task process {task_id} (pid {proc.pid}) raised an exception: " + (
            self._exit_words(proc)
        )

    @staticmethod
    def _exit_words(proc: TaskProcess) -> str:
        code = proc.poll()
        if code is None:
            return "still running"
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exit code {code}"

    @staticmethod
    def _close_stdin(proc: TaskProcess) -> None:
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()

    # -- the job manager's side ------------------------------------------------------------
    def cancel(self) -> None:
        """End every process still running (SIGKILL; a cancelled task had its grace)."""
        with self._lock:
            self._cancelled = True
            procs = list(self.procs)
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()

    def release(self) -> None:
        """Let the task processes exit (a task that is done waits for this: its last
        messages are read before its connections drop)."""
        for proc in list(self.procs):
            self._close_stdin(proc)

    def join(self, timeout: float) -> bool:
        """Release the processes and wait up to ``timeout`` until all are reaped."""
        self.release()
        self.thread.join(timeout)
        return not self.thread.is_alive()
