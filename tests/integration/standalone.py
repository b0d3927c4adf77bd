"""A real Spark standalone cluster on 127.0.0.1 for the tests and the cluster benchmark.

pip's pyspark has ``bin/spark-class`` but no ``sbin/`` start scripts: the master and
every worker are started as ``spark-class org.apache.spark.deploy.{master.Master,
worker.Worker}``, each in its own process group (a worker's executor JVMs and their
Python workers are in its group), on ports the OS chose, with every work and local dir
under one directory. Readiness is read from the master's JSON page, never waited for
with a fixed sleep. ``stop()`` ends every group it started (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"
START_TIMEOUT = 90.0  # JVM start-up on a loaded 2-core machine
STOP_TIMEOUT = 10.0


class ClusterError(RuntimeError):
    """The test cluster did not reach the state a test waits for."""


def spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


def free_port() -> int:
    """A port the OS considers free right now (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(condition: Callable[[], bool], timeout: float, what: str, poll: float = 0.2) -> None:
    """Poll ``condition`` until it holds; ClusterError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Daemon:
    """One JVM started by spark-class, leader of its own process group."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    argv: list[str]

    @property
    def pgid(self) -> int:
        return self.proc.pid  # start_new_session: the leader's pid is the group id

    def kill(self) -> None:
        """SIGKILL the whole group: the JVM, and for a worker its executors and their
        Python workers (a machine that lost power)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        self.proc.wait(timeout=STOP_TIMEOUT)

    def stop(self) -> None:
        """SIGTERM the group, SIGKILL it if anything of it is still there after
        STOP_TIMEOUT; returns when no process of the group is left."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=STOP_TIMEOUT)  # reaps the leader: no zombie counts
        with contextlib.suppress(ClusterError):
            wait_for(lambda: not group_alive(self.pgid), STOP_TIMEOUT, f"{self.name} to stop")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        self.proc.wait(timeout=STOP_TIMEOUT)
        wait_for(lambda: not group_alive(self.pgid), STOP_TIMEOUT, f"{self.name}'s group to end")


class StandaloneCluster:
    """A master and ``workers`` workers of ``cores`` slots each, on 127.0.0.1.

    Spark cores are task slots, not CPUs: a 2-core machine can offer 4 slots per worker.
    Nothing is started before ``start()``.
    """

    def __init__(self, root: Path, workers: int = 2, cores: int = 2, memory: str = "1g") -> None:
        self.root = root
        self.initial_workers = workers
        self.cores = cores
        self.memory = memory
        self.master: Daemon | None = None
        self.workers: list[Daemon] = []
        self.port = 0
        self.webui_port = 0
        self._count = 0

    # -- addresses ------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The environment of every daemon (and of a driver that wants the same dirs)."""
        conf = self.root / "conf"
        conf.mkdir(parents=True, exist_ok=True)  # empty: no host-wide spark-defaults
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # code comes by zip
        return dict(
            env,
            SPARK_HOME=spark_home(),
            SPARK_CONF_DIR=str(conf),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOCAL_DIRS=str(self.root / "local"),
            SPARK_DAEMON_MEMORY="256m",
            # The daemons are small and short-lived: C1 only and a serial GC start faster.
            SPARK_DAEMON_JAVA_OPTS="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        )

    # -- state ------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The master's JSON page (workers, apps); {} while it does not answer."""
        url = f"http://127.0.0.1:{self.webui_port}/json/"
        try:
            with urllib.request.urlopen(url, timeout=2.0) as reply:
                data: dict[str, Any] = json.load(reply)
                return data
        except (urllib.error.URLError, OSError, ValueError):
            return {}

    def alive_workers(self) -> int:
        return sum(1 for w in self.state().get("workers", []) if w.get("state") == "ALIVE")

    def slots(self) -> int:
        """Cores of the ALIVE workers: the most task slots an application can get."""
        return sum(w["cores"] for w in self.state().get("workers", []) if w["state"] == "ALIVE")

    # -- life cycle ------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str]) -> Daemon:
        log = self.root / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        argv = [os.path.join(spark_home(), "bin", "spark-class"), *args]
        out: IO[bytes]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                argv,
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return Daemon(name, proc, log, argv)

    @staticmethod
    def _args(main: str, **options: object) -> list[str]:
        """``main --host 127.0.0.1 --option value ...`` (underscores become dashes)."""
        argv = [main, "--host", "127.0.0.1"]
        for name, value in options.items():
            argv += [f"--{name.replace('_', '-')}", str(value)]
        return argv

    def start(self) -> StandaloneCluster:
        """Start the master and the workers; returns when all workers are ALIVE."""
        (self.root / "local").mkdir(parents=True, exist_ok=True)
        self.port, self.webui_port = free_port(), free_port()
        self.master = self._spawn(
            "master",
            self._args(MASTER, port=self.port, webui_port=self.webui_port),
        )
        try:
            wait_for(lambda: "workers" in self.state(), START_TIMEOUT, "the master's web UI")
            for _ in range(self.initial_workers):
                self.add_worker(wait=False)
            self.wait_workers(self.initial_workers)
        except BaseException:
            self.stop()
            raise
        return self

    def add_worker(self, wait: bool = True) -> Daemon:
        """Start one more worker (e.g. replacing a lost one); with ``wait``, return once
        the master counts it ALIVE."""
        self._count += 1
        work = self.root / f"worker-{self._count}"
        work.mkdir(parents=True, exist_ok=True)
        expected = self.alive_workers() + 1
        worker = self._spawn(
            f"worker-{self._count}",
            [
                *self._args(
                    WORKER,
                    webui_port=free_port(),
                    cores=self.cores,
                    memory=self.memory,
                    work_dir=work,
                ),
                self.url,
            ],
        )
        self.workers.append(worker)
        if wait:
            self.wait_workers(expected)
        return worker

    def wait_workers(self, n: int, timeout: float = START_TIMEOUT) -> None:
        wait_for(lambda: self.alive_workers() == n, timeout, f"{n} ALIVE workers")

    def kill_worker(self, worker: Daemon) -> None:
        """SIGKILL a worker's JVM with its executors; returns once the master dropped it."""
        before = self.alive_workers()
        worker.kill()
        wait_for(lambda: self.alive_workers() < before, START_TIMEOUT, "the master to drop it")

    def daemons(self) -> list[Daemon]:
        return [*self.workers, *([self.master] if self.master else [])]

    def stop(self) -> None:
        """Stop every worker, then the master (each group: SIGTERM, then SIGKILL)."""
        for daemon in self.daemons():
            daemon.stop()

    def leftovers(self) -> list[str]:
        """Daemons whose process group still has a process (empty after ``stop()``)."""
        return [d.name for d in self.daemons() if group_alive(d.pgid)]

    def logs(self, tail: int = 3000) -> str:
        """The end of every daemon's log, for an assertion message."""
        return "\n".join(f"--- {d.name} ---\n{d.log.read_text()[-tail:]}" for d in self.daemons())


def result_fields(out: str) -> dict[str, str]:
    """The ``key=value`` fields of the last ``RESULT`` line a submitted test job printed."""
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise AssertionError(f"no RESULT line in the job's output:\n{out[-3000:]}")
    return dict(item.split("=", 1) for item in lines[-1].split()[1:])
