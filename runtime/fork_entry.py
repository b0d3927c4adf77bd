"""The fork server of the local launcher: one process that imports the task side once and
forks a task process for each request (as ``multiprocessing``'s forkserver does).

    python -m runtime.fork_entry FD

A task process started afresh spends ~0.5 s of CPU importing absflow, zmq and
cloudpickle before it does anything; the test harness starts thousands. Forked from here
it starts with all of that imported. The launcher's side is ``jobmanager.fork_server``.

Protocol, over the ``SOCK_SEQPACKET`` Unix socket at FD (one JSON message a packet):

* launcher -> server: ``{"index": task index, "env": {...}, "cwd": str}`` with four
  descriptors attached (``SCM_RIGHTS``): the task's stdin, the pipe it writes its
  endpoints to, and the stdout and stderr the task writes to (the launcher's own, at
  the moment of the request, as ``subprocess.Popen`` would pass them). The server
  answers ``{"pid": int}`` (or ``{"error": str}``) once it forked.
* launcher -> server: ``{"preload": [module, ...]}``, no descriptor: import the modules a
  job's tasks would import when they unpickle it (``JobConfig.fork_preload``), so that
  every task forked after it starts with them imported. The server answers
  ``{"stale": bool, "failed": {module: error}, "threads": n}``: ``stale`` when a file
  an earlier preload loaded has changed since (it imports nothing then; the launcher
  starts a new server, as a fresh task would import the file as it is now); ``failed``
  the modules that did not import (each task meets the same error itself); ``threads``
  the Python threads after the imports: more than one, and a fork would copy another
  thread's locks, so the server forks no more.
* server -> launcher, whenever a child exits: ``{"exit": pid, "code": int}`` (negative:
  the signal that ended it, as ``Popen.returncode``).

The child starts a session of its own (a Ctrl-C at the terminal reaches the job
manager only), takes the request's environment and working directory, and runs
``runtime.local_entry.run_process``. The server forks from one thread and starts none:
a fork never copies a lock held by another thread. It ends when the launcher's end of
the socket closes (the job manager exited, even by SIGKILL); its children end
themselves when their stdin closes, as any task process of the local launcher.

Threading: single-threaded (it forks).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import socket
import sys
import threading
import traceback
from typing import Any

FDS = 4  # stdin, endpoint pipe, stdout, stderr
MAX_MESSAGE = 1 << 20
REAP_SECONDS = 0.01


PRELOAD = ("cloudpickle", "zmq", "runtime.local_entry", "runtime.task_entry", "runtime.task")
"""What every task process imports (the import takes ~0.5 s of CPU)."""


def preload() -> None:
    for name in PRELOAD:
        importlib.import_module(name)


def serve(sock: socket.socket) -> None:
    """Answer requests until the launcher closes its end; reap and report children."""
    children: set[int] = set()
    loaded: dict[str, int | None] = {}  # file -> mtime of what preloads imported
    forks = True  # until an import started a thread
    while True:
        ready, _, _ = select.select([sock], [], [], REAP_SECONDS)
        if ready:
            try:
                data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, FDS)
            except OSError:
                return
            if not data:
                return  # the launcher is gone
            if not fds and data.startswith(b'{"preload"'):
                forks = _preload(sock, json.loads(data)["preload"], loaded) and forks
                continue
            pid = _spawn(sock, data, fds, forks)
            if pid is not None:
                children.add(pid)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _preload(sock: socket.socket, modules: list[str], loaded: dict[str, int | None]) -> bool:
    """Import ``modules`` (see the protocol); False once an import started a thread."""
    if any(_mtime(path) != mtime for path, mtime in loaded.items()):
        _send(sock, {"stale": True, "failed": {}, "threads": threading.active_count()})
        return threading.active_count() == 1
    before = set(sys.modules)
    failed = {}
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as err:  # SystemExit too: the task meets it again itself
            failed[name] = f"{type(err).__name__}: {err}"
    for name in set(sys.modules) - before:
        path = getattr(sys.modules[name], "__file__", None)
        if isinstance(path, str):
            loaded[path] = _mtime(path)
    threads = threading.active_count()
    _send(sock, {"stale": False, "failed": failed, "threads": threads})
    return threads == 1


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _spawn(sock: socket.socket, data: bytes, fds: list[int], forks: bool = True) -> int | None:
    try:
        request = json.loads(data)
        if len(fds) != FDS:
            raise ValueError(f"expected {FDS} descriptors with the request, got {len(fds)}")
        if not forks:
            raise RuntimeError("a preloaded module started a thread: this server forks no more")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
    except Exception as err:  # a bad request or no fork: the launcher says what failed
        for fd in fds:
            os.close(fd)
        _send(sock, {"error": f"{type(err).__name__}: {err}"})
        return None
    if pid == 0:
        _child(sock, request, fds)  # never returns
    for fd in fds:
        os.close(fd)  # the child's now: the launcher sees the endpoint pipe close with it
    _send(sock, {"pid": pid})
    return pid


def _child(sock: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become the task process described by ``request``."""
    try:
        sock.close()
        os.setsid()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        stdin, endpoint, out, err = fds
        for fd, target in ((stdin, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
        for fd in (stdin, out, err):
            if fd > 2:
                os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        argv = [str(int(request["index"])), str(endpoint)]
        from runtime.local_entry import run_process

        with open(0, "rb", closefd=False) as stdin_stream:
            run_process(argv, stdin_stream)
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(1)


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the launcher is gone: the loop ends on its next read
        sock.send(json.dumps(message).encode())


def main(argv: list[str]) -> int:
    sock = socket.socket(fileno=int(argv[0]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the job manager decides when it ends
    preload()
    if threading.active_count() != 1:  # a fork would copy another thread's locks
        print("absflow fork server: an import started a thread; not forking", file=sys.stderr)
        return 1
    _send(sock, {"ready": os.getpid()})
    serve(sock)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
