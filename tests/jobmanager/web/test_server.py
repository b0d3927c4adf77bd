"""The dashboard's HTTP server (``jobmanager.web.server``) and the per-job ``Dashboard``:
routing, errors, static files, binding, and clients that cannot block publishing (no Spark)."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.error
import urllib.request

import pytest

from jobmanager.metrics import RunMetrics
from jobmanager.web import Dashboard, api, close_all, serve
from jobmanager.web.server import DashboardServer, UiError
from runtime.config import JobConfig
from runtime.errors import GraphError
from statebackend.metrics import TaskMetrics
from tests.jobmanager.fakes import small_plan
from tests.jobmanager.web.fakes import get, published


def test_unknown_paths_404_and_bad_queries_400_never_a_traceback(
    server: DashboardServer,
) -> None:
    published(server)
    base = server.url
    for path in ("api/nope", "nope", "static/../server.py", "static/%2e%2e/server.py", "api/"):
        status, _, body = get(base + path)
        assert status == 404, path
        assert b"Traceback" not in body
    for query in (
        "checkpoints?limit=ten",
        "checkpoints?limit=0",
        "tasks?color=red",
        "tasks?job=a&job=b",
    ):
        status, ctype, body = get(base + "api/" + query)
        assert status == 400 and ctype == "application/json", query
        assert "error" in json.loads(body)
    assert get(base + "api/tasks?job=unknown")[0] == 404
    assert get(base + "metrics?limit=3")[0] == 400
    req = urllib.request.Request(base + "api/jobs", method="POST", data=b"{}")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 405  # read-only


def test_the_dashboard_page_and_its_vendored_libraries_are_served(server: DashboardServer) -> None:
    published(server)
    status, ctype, page = get(server.url)
    assert status == 200 and ctype.startswith("text/html")
    for src in (
        b"/static/vendor/cytoscape.min.js",
        b"/static/app.js",
        b"/static/vendor/uPlot.iife.min.js",
    ):
        assert src in page
        assert get(server.url + src.decode().lstrip("/"))[0] == 200
    assert b"http://" not in page and b"https://" not in page  # no CDN


def test_binds_127_0_0_1_by_default_and_a_taken_port_picks_another() -> None:
    config = JobConfig()
    assert config.ui_host == "127.0.0.1" and config.ui
    said: list[str] = []
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        try:
            dash = Dashboard(small_plan(), JobConfig(ui_port=port), RunMetrics(small_plan()))
            assert dash.url is None  # nothing is bound before open()
            dash.open(said.append)
            assert dash.url is not None and f":{port}/" not in dash.url
            assert said and f"port {port} is in use" in said[0]
            srv = serve("127.0.0.1", port, said.append)  # the job's server, found again
            assert srv.httpd.server_address[0] == "127.0.0.1"
            assert get(srv.url + "api/jobs")[0] == 200
        finally:
            close_all()


def test_ui_false_serves_nothing_and_bad_settings_are_named() -> None:
    dash = Dashboard(small_plan(), JobConfig(ui=False), RunMetrics(small_plan()))
    assert dash.open(print) is None and dash.url is None
    dash.finish("finished")  # no-op
    with pytest.raises(GraphError, match="ui_port must be a TCP port"):
        JobConfig(ui_port=70000)
    with pytest.raises(UiError, match=r"ui_host='256\.1\.1\.1'"):
        serve("256.1.1.1", 0, print)


def test_a_stuck_client_does_not_block_publishing_or_other_clients(
    server: DashboardServer,
) -> None:
    _, builder, attempt = published(server)
    with socket.create_connection(("127.0.0.1", server.port)) as stuck:
        stuck.sendall(b"GET /api/jobs HTTP/1.1\r\n")  # never finishes its request
        attempt.tasks[0].metrics = TaskMetrics(records_in=99, uptime_seconds=2.0)
        publishing = threading.Thread(target=builder.publish, args=(attempt,))
        publishing.start()  # a reference swap: no wait on any client
        publishing.join(30)  # (a guard against a hang, not a measure)
        assert not publishing.is_alive(), "publish waited for the stuck client"
        tasks = json.loads(get(server.url + "api/tasks")[2])["tasks"]
        assert tasks[0]["records_in"] == 99
        stuck.setblocking(False)  # ... and the stuck client is still waiting: no answer yet
        with pytest.raises(BlockingIOError):
            stuck.recv(1)


def test_head_answers_headers_only_and_a_failing_route_answers_500_in_json(
    server: DashboardServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    published(server)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("HEAD", "/api/jobs")
        res = conn.getresponse()
        length = int(res.getheader("Content-Length") or 0)
        assert res.status == 200 and length > 0 and res.read() == b""
        assert res.getheader("Cache-Control") == "no-store"
        assert res.getheader("X-Content-Type-Options") == "nosniff"
    finally:
        conn.close()

    def broken(*_args: object) -> None:
        raise RuntimeError("a bug in a handler")

    monkeypatch.setattr(api, "answer", broken)
    status, ctype, body = get(server.url + "api/jobs")
    assert (status, ctype) == (500, "application/json")
    assert json.loads(body) == {"error": "internal error; see the job manager's log"}
    assert get(server.url + "metrics?job=nope")[0] == 404  # /metrics names no such job
