"""Shared fixtures: one SparkSession per test session, a leak check per test, the
test harness (``harness``: jobs run as local task processes, without Spark), a
local fake S3 (moto's server on loopback) for the checkpoint-storage tests, a
PostgreSQL server in a temp dir for the connector tests, and a
Spark standalone cluster on 127.0.0.1 for the tests that need a real one."""

from __future__ import annotations

import atexit
import glob
import importlib
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from tests.integration.standalone import StandaloneCluster

if TYPE_CHECKING:
    from jobmanager.web import DashboardServer

SLOTS_NEEDED = 18  # the biggest test job (diamond) has 16 tasks, +2 spare slots for restarts

# This test session's own temp dir, inherited (TMPDIR) by Spark's JVM and its Python
# workers: the leak checks see this session's absflow dirs only, also while another
# test session runs on the same machine. Under pytest-xdist each worker is a session of
# its own (its own dir, beside the controller's): workers never see each other's files.
# A process started by the session that imports this module (a task unpickling a test's
# function) keeps the session's dir: the variable names the owner ("gw0=/tmp/abstest-…"),
# and an xdist worker, which inherits the controller's variable, is not that owner.
SESSION_TMP_VAR = "ABSFLOW_TEST_SESSION_TMP"
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
_owner, _, _inherited = os.environ.get(SESSION_TMP_VAR, "").partition("=")
_OWN_TMP = not _inherited or _owner != WORKER
if _OWN_TMP:
    # beside the controller's dir (not inside it), or in the machine's temp dir
    _base = os.path.dirname(_inherited) if _inherited else None
    SESSION_TMP = tempfile.mkdtemp(prefix=f"abstest-{WORKER}-", dir=_base)
else:
    SESSION_TMP = _inherited
os.environ[SESSION_TMP_VAR] = f"{WORKER}={SESSION_TMP}"
os.environ["TMPDIR"] = SESSION_TMP
tempfile.tempdir = None
if _OWN_TMP:  # at exit, after every handler registered later (pgserver's lock file)
    atexit.register(shutil.rmtree, SESSION_TMP, ignore_errors=True)


# The local launcher's fork server imports the modules a job refers to (the test modules
# whose functions the tasks unpickle: pytest, networkx...) once, not in each task process
# (JobConfig.fork_preload): no test module opens a connection or starts a thread at import.
os.environ.setdefault("ABSFLOW_FORK_PRELOAD", "1")


# Every JVM the tests start (local Spark, spark-submit's drivers, standalone executors) is
# short-lived: the C1 compiler only and a serial GC spend ~40 % less CPU (two standalone
# tests: 114 s of CPU -> 67 s), and the suite is CPU-bound on two cores. The JVM says
# "Picked up JAVA_TOOL_OPTIONS" on its stderr. A value already set is kept.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


# Fixtures that start a heavy server once per session (per xdist worker): their tests
# run on one worker (``--dist loadgroup``), so a run starts one Spark JVM (and one
# standalone cluster) and one PostgreSQL server for the PostgreSQL tests off Spark, not one
# per worker (a Spark test that also writes to PostgreSQL, tests/integration/
# test_connectors.py, starts a second one on the Spark worker). Tests marked
# ``integration`` run on local Spark even where they do not ask for the fixture.
SPARK_FIXTURES = frozenset({"spark", "standalone"})


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & SPARK_FIXTURES or item.get_closest_marker("integration") is not None:
            item.add_marker(pytest.mark.xdist_group("spark"))
        elif "postgres" in names:
            item.add_marker(pytest.mark.xdist_group("postgres"))


@pytest.fixture(scope="session", autouse=True)
def session_tmp() -> Iterator[str]:
    yield SESSION_TMP
    from jobmanager.fork_server import close_fork_servers

    close_fork_servers()  # the local launcher's, kept for the session
    if _OWN_TMP:
        shutil.rmtree(SESSION_TMP, ignore_errors=True)


@pytest.fixture
def context() -> Iterator[Any]:
    """A ZeroMQ context for a test's own sockets, destroyed (linger 0) after it."""
    import zmq

    ctx: zmq.Context[Any] = zmq.Context()
    try:
        yield ctx
    finally:
        ctx.destroy(linger=0)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The embedded local SparkSession absflow creates, sized for every test job."""
    from jobmanager import launcher
    from runtime.config import JobConfig

    session = launcher.ensure_session(SLOTS_NEEDED - launcher.SPARE_SLOTS, JobConfig())
    yield session
    launcher._stop_owned()


def _our_processes() -> set[int]:
    """This process and its descendants (Spark's JVM, its Python workers, our tasks)."""
    children: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        pid = int(stat.split("/")[2])
        children.setdefault(int(fields[1]), []).append(pid)
    ours, todo = set(), [os.getpid()]
    while todo:
        pid = todo.pop()
        ours.add(pid)
        todo.extend(children.get(pid, ()))
    return ours


def _socket_inodes(pids: set[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue  # gone meanwhile
    return inodes


def session_socket_inodes() -> set[str]:
    """Inodes of the sockets that this session's processes hold: this process's tree, and
    any process started with this session's temp-dir variable (a task that outlived its
    parent still counts): not another xdist worker's, nor another test session's."""
    mark = f"{SESSION_TMP_VAR}={WORKER}={SESSION_TMP}".encode()
    pids = _our_processes()
    for environ in glob.glob("/proc/[0-9]*/environ"):
        try:
            with open(environ, "rb") as fh:
                if mark in fh.read().split(b"\0"):
                    pids.add(int(environ.split("/")[2]))
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return _socket_inodes(pids)


def _listening_ports() -> set[int]:
    """Ports that this process or one of its descendants listens on (not another test
    session's on the same machine)."""
    ours = _socket_inodes(_our_processes())
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh)
                for line in fh:
                    parts = line.split()
                    if parts[3] == "0A" and parts[9] in ours:  # LISTEN, a socket of ours
                        ports.add(int(parts[1].rsplit(":", 1)[1], 16))
        except OSError:
            pass
    return ports


def _absflow_tmp() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "absflow-*")))


def close_dashboards() -> None:
    from jobmanager.web import close_all

    close_all()


@pytest.fixture(autouse=True)
def _dashboards_closed() -> Iterator[None]:
    """Every job starts the dashboard (ui=True by default), which stays up after the job
    until the driver exits: no test leaves one behind."""
    yield
    close_dashboards()


@dataclass(frozen=True)
class Leftovers:
    """What a test left behind compared with a ``Footprint`` taken before it."""

    ports: list[int]
    dirs: list[str]
    children: list[int]

    def problems(self) -> list[str]:
        said = []
        if self.children:
            said.append(f"task processes left behind: {self.children}")
        if self.ports:
            said.append(f"ports still listening after the job: {self.ports}")
        if self.dirs:
            said.append(f"temp dirs left behind: {self.dirs}")
        return said


@dataclass(frozen=True)
class Footprint:
    """This session's listening ports, absflow temp dirs and (``children``) child
    processes at one moment. Each is this session's own (this process's tree, this
    session's temp dir: an xdist worker sees neither another worker's nor another test
    session's)."""

    ports: frozenset[int]
    dirs: frozenset[str]
    children: frozenset[int] | None

    @classmethod
    def take(cls, children: bool) -> Footprint:
        kids = frozenset(task_processes()) if children else None
        return cls(frozenset(_listening_ports()), frozenset(_absflow_tmp()), kids)

    def leftovers(self, timeout: float = 5.0) -> Leftovers:
        """What is there now and was not before, once it has not gone within ``timeout``
        seconds (a task's process and sockets end a little after the job returns)."""
        deadline = time.monotonic() + timeout
        while True:
            now = Footprint.take(self.children is not None)
            found = Leftovers(
                sorted(now.ports - self.ports),
                sorted(now.dirs - self.dirs),
                sorted((now.children or frozenset()) - (self.children or frozenset())),
            )
            if not found.problems() or time.monotonic() > deadline:
                return found
            time.sleep(0.05)


@pytest.fixture
def server() -> Iterator[DashboardServer]:
    """A dashboard server on a free loopback port, closed (with every other) after the test."""
    from jobmanager.web import serve

    srv = serve("127.0.0.1", 0, say=print)
    yield srv
    close_dashboards()


@pytest.fixture
def no_leaks(spark: Any) -> Iterator[None]:
    """After the test: no port our tasks or job manager bound is still listening, and
    no absflow temp dir is left (Spark's own pooled workers hold no absflow socket)."""
    before = Footprint.take(children=False)
    yield
    close_dashboards()  # they outlive a job on purpose (until the driver exits)
    problems = before.leftovers().problems()
    assert not problems, "; ".join(problems)


def task_processes() -> set[int]:
    """This process's children, but the local launcher's fork servers (kept for the
    session) in place of their children (the task processes they forked)."""
    from jobmanager.fork_server import fork_server_pids

    servers = fork_server_pids()
    found = child_processes() - servers
    for server in servers:
        found |= child_processes(server)
    return found


def child_processes(parent: int | None = None) -> set[int]:
    """PIDs of the living children (zombies excluded) of ``parent`` (default: this process)."""
    me, found = str(parent or os.getpid()), set()
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if fields[1] == me and fields[0] != "Z":
            found.add(int(stat.split("/")[2]))
    return found


@pytest.fixture
def harness(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Jobs of the test run on the local launcher (``runtime.api.testing``: task processes
    without Spark, ``ABSFLOW_LAUNCHER=local``). After the test: no task process, port or
    absflow temp dir is left."""
    from jobmanager.launchers import ENV_VAR

    monkeypatch.setenv(ENV_VAR, "local")
    before = Footprint.take(children=True)
    yield
    close_dashboards()  # they outlive a job on purpose (until the driver exits)
    problems = before.leftovers().problems()
    assert not problems, "; ".join(problems)


@pytest.fixture(autouse=True)
def _launcher_by_marker(request: pytest.FixtureRequest) -> None:
    """Tests marked ``harness`` run on the test harness (the ``harness`` fixture); in such
    a module, a test also marked ``integration`` stays on local Spark (``no_leaks``)."""
    if request.node.get_closest_marker("harness") is None:
        return
    if request.node.get_closest_marker("integration") is not None:
        request.getfixturevalue("no_leaks")
    else:
        request.getfixturevalue("harness")


# -- S3 (moto) -----------------------------------------------------------------------------
S3_BUCKET = "absflow-test"


@dataclass(frozen=True)
class FakeS3:
    """moto's S3 server on 127.0.0.1. ``options`` are the storage_options that reach it,
    with dummy credentials: they exist only in these options (nothing goes into the
    environment, so no other test sees them)."""

    endpoint: str
    bucket: str

    @property
    def options(self) -> dict[str, Any]:
        return {
            "key": "absflow-test-key",
            "secret": "absflow-test-secret",
            "endpoint_url": self.endpoint,
            "client_kwargs": {"region_name": "us-east-1"},
            "config_kwargs": {"retries": {"max_attempts": 2}},
        }

    def url(self, *parts: str) -> str:
        return "/".join([f"s3://{self.bucket}", *parts])

    def client(self) -> Any:
        """A boto3 client of the server (to look behind s3fs: uploads, raw objects)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="absflow-test-key",
            aws_secret_access_key="absflow-test-secret",
            region_name="us-east-1",
        )


@pytest.fixture(scope="session")
def s3() -> Iterator[FakeS3]:
    """moto's server on a free loopback port (the OS picks it: port 0), with one bucket;
    stopped at the end of the session."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        fake = FakeS3(f"http://{host}:{port}", S3_BUCKET)
        fake.client().create_bucket(Bucket=S3_BUCKET)
        yield fake
    finally:
        server.stop()


@pytest.fixture
def s3_root(s3: FakeS3, request: pytest.FixtureRequest) -> str:
    """A fresh checkpoint root in the fake bucket, named after the test."""
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60]
    return s3.url(f"{name}-{uuid.uuid4().hex[:6]}")


# -- PostgreSQL (pgserver's wheel) --------------------------------------------------------
@dataclass(frozen=True)
class Postgres:
    """A PostgreSQL server (two-phase commit on) in a temp dir; ``dsn`` reaches it over its Unix socket (no TCP port)."""

    dsn: str
    datadir: str

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cur = conn.execute(sql, params)
            return list(cur.fetchall()) if cur.description else []

    def prepared(self) -> list[str]:
        return [gid for (gid,) in self.query("SELECT gid FROM pg_prepared_xacts ORDER BY gid")]


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    # a test dependency: where it is missing the connector tests fail, never skip
    pgserver: Any = importlib.import_module("pgserver")

    datadir = tempfile.mkdtemp(prefix="pgserver-absflow-")
    server = pgserver.get_server(datadir, cleanup_mode="stop")
    try:
        server.psql("ALTER SYSTEM SET max_prepared_transactions = 64;")
        server.cleanup()  # restart: the setting needs it
        server = pgserver.get_server(datadir, cleanup_mode="stop")
        pg = Postgres(server.get_uri(), datadir)
        yield pg
        leftover = pg.prepared()
        assert not leftover, f"prepared transactions left behind: {leftover}"
    finally:
        server.cleanup()
        shutil.rmtree(datadir, ignore_errors=True)


@pytest.fixture
def pg_table(postgres: Postgres, request: pytest.FixtureRequest) -> str:
    """A fresh table (id int, name text, n int) named after the test."""
    name = "t_" + "".join(c if c.isalnum() else "_" for c in request.node.name)[:50].lower()
    postgres.query(f"DROP TABLE IF EXISTS {name}")
    postgres.query(f"CREATE TABLE {name} (id int, name text, n int)")
    return name


# -- a Spark standalone cluster ----------------------------------------------------------
@pytest.fixture(scope="session")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A master and two workers of 2 slots each (Spark cores are slots, not CPUs), started
    on first use; at the end every process it started is gone, or the teardown fails."""
    cluster = StandaloneCluster(tmp_path_factory.mktemp("standalone"), workers=2, cores=2)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        assert not cluster.leftovers(), (
            f"processes left by the standalone cluster: {cluster.leftovers()}"
        )
