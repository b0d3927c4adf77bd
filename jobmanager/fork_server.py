"""The local launcher's side of the fork server (``runtime.fork_entry``): task processes
forked from a process that imported the task side once, instead of started afresh.

A fresh task process spends ~0.5 s of CPU on imports before it runs; the harness starts
several per job, and the test suite thousands. `ForkServer.spawn` gives a `ForkedTask`
that the launcher uses as it uses a ``subprocess.Popen`` (``pid``, ``stdin``, ``poll``,
``kill``, ``returncode``). One server per driver process, Python environment and kind
(`fork_server`): a driver whose ``sys.path`` changed gets a new one (the old one ends
once the processes it forked have). A server that died or cannot start makes
`fork_server` return None, and the launcher starts processes afresh.
``JobConfig.fork_server`` turns it off.

Preloading (``JobConfig.fork_preload``; a server of its own kind): before a job's tasks
are forked, the server also imports the modules the job's pickle refers to
(`dumps_naming_modules`), so each task unpickles the job without importing them again.
Module-level state is then made once, in the server, and shared by the tasks forked
after (as with ``multiprocessing``'s fork start method): that is why it is a setting. A
preloading server whose preloaded files changed on disk, or whose imports started a
thread, is retired (no new task, closed once idle) and a new one started.

The server is the driver's child in a session of its own; its task processes are its
children. They end themselves when their stdin closes (the driver holds its write end),
and the server ends when the driver's end of its socket closes: neither outlives a
SIGKILLed driver.

Threading: `spawn` from any thread (one request at a time); a reader thread records the
exits the server reports.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import types
from collections.abc import Collection
from typing import IO, Any

import cloudpickle

from jobmanager.liveness import pid_alive

log = logging.getLogger("absflow.launcher")

START_SECONDS = 60.0
MAX_MESSAGE = 1 << 16
STALE = "a file it preloaded changed"
THREADS = "a preloaded module started a thread"


class ForkServerError(RuntimeError):
    """The fork server could not fork a task process (it says why)."""


class ForkedTask:
    """A task process forked by the server, used like a ``subprocess.Popen``."""

    def __init__(self, server: ForkServer, pid: int, stdin: IO[bytes]) -> None:
        self.server, self.pid = server, pid
        self.stdin: IO[bytes] | None = stdin
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """One running fork server (see the module docstring)."""

    def __init__(self, pythonpath: str, preloading: bool = False) -> None:
        self.pythonpath, self.preloading = pythonpath, preloading
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "runtime.fork_entry", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=dict(os.environ, PYTHONPATH=pythonpath),
                start_new_session=True,
            )
        finally:
            theirs.close()
        self.sock = mine
        self._lock = threading.Lock()  # one request at a time
        self._exits: dict[int, int] = {}
        self._spawned: set[int] = set()
        self._replies: list[dict[str, Any]] = []
        self._changed = threading.Condition()
        self.closed = False
        self.retired = False  # no new task: closed once idle
        self.preloaded: set[str] = set()
        mine.settimeout(START_SECONDS)
        try:
            ready = json.loads(mine.recv(4096) or b"{}")
        except (OSError, ValueError):
            ready = {}
        mine.settimeout(None)
        if "ready" not in ready:
            self.close()
            raise ForkServerError(
                f"the fork server did not start (exit {self.proc.poll()}); task processes "
                "are started afresh"
            )
        self.pid = int(ready["ready"])
        self._reader = threading.Thread(target=self._read, name="absflow-fork-server", daemon=True)
        self._reader.start()

    @property
    def alive(self) -> bool:
        return not self.closed and self.proc.poll() is None

    def spawn(self, index: int, endpoint_fd: int, env: dict[str, str]) -> ForkedTask:
        """Fork task process ``index``: it writes its endpoints to ``endpoint_fd`` (the
        caller closes its copy) and reads the attempt from the returned ``stdin``."""
        r, w = os.pipe()
        stdin = os.fdopen(w, "wb")
        try:
            request = {"index": index, "env": env, "cwd": os.getcwd()}
            with self._lock:
                socket.send_fds(self.sock, [json.dumps(request).encode()], [r, endpoint_fd, 1, 2])
                reply = self._reply()
        except BaseException:
            stdin.close()
            raise
        finally:
            os.close(r)
        if "pid" not in reply:
            stdin.close()
            raise ForkServerError(f"the fork server could not fork: {reply.get('error')}")
        pid = int(reply["pid"])
        with self._changed:
            self._spawned.add(pid)
        return ForkedTask(self, pid, stdin)

    def preload(self, modules: Collection[str]) -> str | None:
        """Have the server import ``modules`` before it forks more tasks. Not None: why
        this server is retired (`STALE`: a file it preloaded changed since; `THREADS`:
        an import started a thread); the caller asks `fork_server` for another."""
        with self._lock:
            socket.send_fds(self.sock, [json.dumps({"preload": sorted(modules)}).encode()], [])
            reply = self._reply()
        if "stale" not in reply:
            raise ForkServerError(f"the fork server could not preload: {reply.get('error')}")
        for name, error in reply["failed"].items():
            log.debug("the fork server could not import %s: %s", name, error)
        self.preloaded.update(modules)
        if not reply["stale"] and reply["threads"] == 1:
            return None
        why = STALE if reply["stale"] else THREADS
        log.info("fork server %d retired: %s", self.pid, why)
        self.retired = True
        return why

    def busy(self) -> bool:
        """Whether a process it forked still runs (its exit is not reported yet)."""
        with self._changed:
            return bool(self._spawned - self._exits.keys())

    def _reply(self) -> dict[str, Any]:
        with self._changed:
            while not self._replies:
                if self.closed:
                    return {"error": "the fork server is gone"}
                self._changed.wait(1.0)
            return self._replies.pop(0)

    def exit_code(self, pid: int) -> int | None:
        """``pid``'s exit code (None while it runs). Once the server is gone a child it
        can no longer report on counts as killed when it no longer lives."""
        with self._changed:
            if pid in self._exits:
                return self._exits[pid]
            gone = self.closed
        if gone and not pid_alive(pid):
            return -signal.SIGKILL
        return None

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                break
            message = json.loads(data)
            with self._changed:
                if "exit" in message:
                    self._exits[int(message["exit"])] = int(message["code"])
                else:
                    if "pid" in message:  # a new process: an old one's pid may be reused
                        self._exits.pop(int(message["pid"]), None)
                    self._replies.append(message)
                self._changed.notify_all()
        with self._changed:
            self.closed = True
            self._changed.notify_all()

    def close(self) -> None:
        """End the server (its running children end when their stdin closes)."""
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        try:
            self.proc.wait(10.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class _Naming(cloudpickle.Pickler):  # type: ignore[misc]  # cloudpickle has no types
    """cloudpickle's pickler, noting the module of every class, function and module it
    pickles (by reference: unpickling imports it)."""

    def __init__(self, file: IO[bytes]) -> None:
        super().__init__(file)
        self.modules: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.ModuleType):
            self.modules.add(obj.__name__)
        elif isinstance(obj, type | types.FunctionType):
            self.modules.add(getattr(obj, "__module__", None) or "__main__")
        return super().reducer_override(obj)


def dumps_naming_modules(obj: Any) -> tuple[bytes, set[str]]:
    """``cloudpickle.dumps(obj)``, and the importable modules it refers to (those this
    process imported from a file: not ``__main__``, a builtin or a generated one)."""
    out = io.BytesIO()
    pickler = _Naming(out)
    pickler.dump(obj)
    modules = {
        name
        for name in pickler.modules
        if name != "__main__" and isinstance(getattr(sys.modules.get(name), "__file__", None), str)
    }
    return out.getvalue(), modules


_servers: list[ForkServer] = []
_servers_lock = threading.Lock()
_unsafe: set[str] = set()  # modules whose import started a thread in a server


def fork_server(pythonpath: str, preload: Collection[str] | None = None) -> ForkServer | None:
    """The fork server for task processes with ``pythonpath`` (started on first use; one
    at a time), or None where it cannot run (the launcher then starts processes afresh).
    With ``preload``, the preloading server, once it has imported those modules (but those
    whose import started a thread); without, one that never preloads (its tasks hold only
    what they import themselves)."""
    with _servers_lock:
        for _ in range(3):  # a retired server is replaced (and its successor, once)
            server = _current(pythonpath, preload is not None)
            if server is None or preload is None:
                return server
            wanted, before = set(preload) - _unsafe, set(server.preloaded)
            try:
                why = server.preload(wanted)
            except (OSError, ForkServerError) as err:
                log.info("fork server %d retired: %s", server.pid, err)
                server.retired = True
                continue
            if why is None:
                return server
            if why == THREADS:
                _unsafe.update(wanted - before)
        return None


def _current(pythonpath: str, preloading: bool) -> ForkServer | None:
    found = None
    for server in list(_servers):  # one for another sys.path, or retired: once idle
        if server.pythonpath == pythonpath and server.alive and not server.retired:
            if server.preloading == preloading:
                found = server
        elif not server.alive or not server.busy():
            server.close()
            _servers.remove(server)
    if found is not None:
        return found
    try:
        server = ForkServer(pythonpath, preloading)
    except (OSError, ForkServerError) as err:
        log.info("task processes start afresh: %s", err)
        return None
    _servers.append(server)
    return server


def fork_server_pids() -> set[int]:
    """The pids of the running fork servers (the test suite's leak check looks past them
    to their children)."""
    with _servers_lock:
        return {s.proc.pid for s in _servers if s.alive}


def close_fork_servers() -> None:
    """End every fork server (at exit; the test suite at its end)."""
    with _servers_lock:
        for server in _servers:
            server.close()
        _servers.clear()


atexit.register(close_fork_servers)
