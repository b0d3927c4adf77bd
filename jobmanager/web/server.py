"""The dashboard's web server: stdlib ``ThreadingHTTPServer`` on a daemon thread.

Read-only: GET and HEAD only (anything else is 405). Bound to 127.0.0.1 unless
``ui_host`` says otherwise; when ``ui_port`` is taken another free port is used and the
job says so. One server per (host, requested port) serves every job of the driver
(``/api/jobs``), and stays up after a job finished until the driver exits (``atexit``) or
`close_all` is called. Handler threads read the jobs' latest snapshots only (see
``jobmanager.web.snapshot``); each connection times out, so a stuck browser holds a
thread of its own and nothing else.

Paths: ``/`` (the dashboard), ``/static/...`` (its files, vendored libraries included:
no CDN), ``/api/...`` (``jobmanager.web.api``), ``/metrics`` (Prometheus, ``?job=``).
"""

from __future__ import annotations

import atexit
import errno
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.registry import CollectorRegistry

from jobmanager.web import api, prom
from jobmanager.web.snapshot import JobBoard

log = logging.getLogger("absflow.jobmanager")

STATIC = Path(__file__).resolve().parent / "static"
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
}


class UiError(Exception):
    """The dashboard cannot be served as configured (names the setting and the fix)."""


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # closing (at exit) never joins a stuck browser's thread
    dashboard: DashboardServer


class DashboardServer:
    """A bound server (``serve`` binds and starts one) and the jobs it shows."""

    def __init__(self, httpd: _HTTPServer, host: str) -> None:
        self.jobs = api.Jobs()
        self.registries: dict[str, CollectorRegistry] = {}
        self.httpd, self.host = httpd, host
        httpd.dashboard = self
        self.port = int(httpd.server_address[1])
        self.thread = threading.Thread(
            target=httpd.serve_forever, name=f"absflow-ui-{self.port}", daemon=True
        )

    def start(self) -> DashboardServer:
        self.thread.start()
        return self

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def add(self, board: JobBoard) -> None:
        self.registries[board.job_id] = prom.registry_for(board)
        self.jobs.add(board)
        for gone in set(self.registries) - set(self.jobs):
            del self.registries[gone]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def _bind(host: str, port: int, say: Callable[[str], None]) -> _HTTPServer:
    if not 0 <= port <= 65535:
        raise UiError(f"ui_port={port} is not a TCP port; use 0..65535 (0: any free port)")
    try:
        return _HTTPServer((host, port), _Handler)
    except OSError as err:
        if err.errno != errno.EADDRINUSE or port == 0:
            raise UiError(
                f"the dashboard cannot listen on ui_host={host!r}, ui_port={port}: {err}; "
                f"use an address of this machine (default 127.0.0.1), or ui=False"
            ) from err
    httpd = _HTTPServer((host, 0), _Handler)
    say(f"dashboard: port {port} is in use; using port {httpd.server_address[1]} instead")
    return httpd


_lock = threading.Lock()
_servers: dict[tuple[str, int], DashboardServer] = {}


def serve(host: str, port: int, say: Callable[[str], None]) -> DashboardServer:
    """The driver's server for (``host``, ``port``), started on first use."""
    with _lock:
        server = _servers.get((host, port)) or next(
            (s for (h, _), s in _servers.items() if h == host and s.port == port), None
        )
        if server is None:
            server = DashboardServer(_bind(host, port, say), host).start()
            _servers[(host, port)] = server
        return server


def close_all() -> None:
    """Stop every dashboard server of this process (at exit; tests call it too)."""
    with _lock:
        servers = list(_servers.values())
        _servers.clear()
    for server in servers:
        server.close()


atexit.register(close_all)


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    timeout = 10  # seconds a connection may stall before its thread gives up
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._serve(body=True)

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def _read_only(self) -> None:
        self._send(405, "application/json", _json({"error": "the dashboard is read-only"}), True)

    do_POST = do_PUT = do_DELETE = do_PATCH = _read_only

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("dashboard: " + format, *args)

    def _serve(self, body: bool) -> None:
        try:
            status, ctype, payload = self._route()
        except Exception:  # never a traceback page: log it, answer 500 in JSON
            log.exception("dashboard: %s failed", self.path)
            status, ctype = 500, "application/json"
            payload = _json({"error": "internal error; see the job manager's log"})
        self._send(status, ctype, payload, body)

    def _route(self) -> tuple[int, str, bytes]:
        url = urlsplit(self.path)
        path, dashboard = url.path, self.server.dashboard
        if path.startswith("/api/"):
            status, answer = api.answer(dashboard.jobs, path[len("/api/") :], url.query)
            return status, "application/json", _json(answer)
        if path == "/metrics":
            try:
                params = api.parse_query(url.query, ("job",))
                board = dashboard.jobs.pick(params.get("job"))
            except api.BadRequest as err:
                return 400, "text/plain; charset=utf-8", f"{err}\n".encode()
            except api.NotFound as err:
                return 404, "text/plain; charset=utf-8", f"{err}\n".encode()
            return (
                200,
                prom.CONTENT_TYPE_LATEST,
                prom.exposition(dashboard.registries[board.job_id]),
            )
        if path in ("/", "/index.html"):
            path = "/static/index.html"
        if path.startswith("/static/"):
            found = _static(path[len("/static/") :])
            if found is not None:
                return 200, _TYPES.get(found.suffix, "application/octet-stream"), found.read_bytes()
        return 404, "text/plain; charset=utf-8", f"not found: {url.path}\n".encode()

    def _send(self, status: int, ctype: str, payload: bytes, body: bool) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if body:
            self.wfile.write(payload)


def _static(name: str) -> Path | None:
    """A file under STATIC, or None (no escaping it with '..' or links)."""
    if not name or "\\" in name or "\0" in name:
        return None
    candidate = (STATIC / name).resolve()
    if STATIC not in candidate.parents or not candidate.is_file():
        return None
    return candidate


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False, default=str).encode()
