"""The ``hosts`` fixture: five network namespaces on one bridge (a Spark master on ``m``,
the driver on ``drv``, one worker of 2 slots on each of ``a``, ``b``, ``c``), shared by a
module's tests, removed with every process afterwards even when a test failed;
``driver``, the driver process on ``drv`` that runs the module's jobs (`Job`) in one
Spark application; ``host_postgres``, a PostgreSQL server on ``drv`` listening on that
host's address only."""

from __future__ import annotations

import contextlib
import glob
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.hosts.netns import Hosts, NamespaceCluster, netns_pids, unavailable
from tests.integration.standalone import ClusterError, wait_for

ROOT = Path(__file__).resolve().parent.parent.parent
JOB = str(Path(__file__).resolve().parent / "hosts_job.py")
DRIVER_TIMEOUT = 300.0
RECORDS = 15_000  # a job's records, unless the test says otherwise


@dataclass
class HostCluster:
    hosts: Hosts
    cluster: NamespaceCluster

    @property
    def driver(self) -> str:
        return self.hosts["drv"].ip


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostCluster]:
    why = unavailable()
    if why is not None:
        pytest.skip(f"no network namespaces here: {why}")
    net = Hosts(["m", "drv", "a", "b", "c"])
    net.create()
    try:
        cluster = NamespaceCluster(net, tmp_path_factory.mktemp("hosts"), "m", ["a", "b", "c"])
        cluster.start()
        yield HostCluster(net, cluster)
    finally:
        net.remove()
        # A deleted namespace's veth goes when the kernel has cleaned the namespace up
        # (asynchronously, soon after its last process).
        with contextlib.suppress(ClusterError):
            wait_for(lambda: not net.leftovers(), 30.0, "the namespaces to be cleaned up")
        assert not net.leftovers(), f"left behind by the host tests: {net.leftovers()}"


def connected(ns: str, ip: str, comm: str) -> list[int]:
    """Processes of namespace ``ns`` named ``comm``... with a TCP connection to ``ip``
    (over IPv4, or IPv6 with a v4-mapped address, as the JVM's sockets are)."""
    ours = []
    v4 = "".join(f"{int(x):02X}" for x in reversed(ip.split(".")))
    remotes = (v4 + ":", "0000000000000000FFFF0000" + v4 + ":")
    for pid in netns_pids(ns):
        try:
            if not Path(f"/proc/{pid}/comm").read_text().startswith(comm):
                continue
            inodes = {
                os.readlink(fd)[8:-1]
                for fd in glob.glob(f"/proc/{pid}/fd/*")
                if os.readlink(fd).startswith("socket:[")
            }
            rows = [
                *Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:],
                *Path(f"/proc/{pid}/net/tcp6").read_text().splitlines()[1:],
            ]
        except OSError:
            continue  # gone meanwhile
        if any(
            f[3] == "01" and f[9] in inodes and f[2].startswith(remotes)
            for f in map(str.split, rows)
        ):
            ours.append(pid)
    return ours


def task_pids(ns: str, driver_ip: str) -> list[int]:
    """The absflow task processes of namespace ``ns``: Python processes with a TCP
    connection to the driver (the job manager's port; Spark's own Python workers talk
    to their executor over loopback only)."""
    return connected(ns, driver_ip, "python")


class DriverService:
    """The driver process on host ``drv`` (hosts_job.py): one Spark application whose
    executors every job of the module reuses; jobs go in one at a time (`Job`)."""

    def __init__(self, env: HostCluster, root: Path) -> None:
        self.env, self.root = env, root
        self.log = root / "driver.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> DriverService:
        drv = self.env.hosts["drv"]
        app = {"master": self.env.cluster.url, "host": self.env.driver, "pythonpath": str(ROOT)}
        environ = dict(
            self.env.cluster.env(drv), PYSPARK_PYTHON=sys.executable, PYTHONPATH=str(ROOT)
        )
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                drv.argv(sys.executable, JOB, json.dumps(app)),
                env=environ,
                cwd=self.root,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(
            lambda: "READY" in self.log.read_text(errors="replace") or not self.alive(),
            DRIVER_TIMEOUT,
            "the driver's SparkSession",
        )
        assert self.alive(), self.log.read_text(errors="replace")[-5000:]
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def submit(self, spec: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(spec) + "\n").encode())
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9)  # the driver and its JVM
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def driver_service(
    hosts: HostCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DriverService]:
    service = DriverService(hosts, tmp_path_factory.mktemp("driver")).start()
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture
def driver(driver_service: DriverService) -> DriverService:
    """The module's driver, started again if a failed test had to end it."""
    return driver_service if driver_service.alive() else driver_service.start()


class Job:
    """One job run by the module's driver, its files under ``root``."""

    def __init__(self, service: DriverService, root: Path, **spec: Any) -> None:
        self.service, self.root = service, root
        self.spec = {
            "checkpoint_dir": str(root / "chk"),
            "files": str(root / "files"),
            "result": str(root / "result.json"),
            "log": str(root / "job.log"),
            "records": RECORDS,
            "rate": 1_500.0,  # ~10 s: checkpoints every 0.3 s, then a fault, then the rest
            "heartbeat_timeout": 15.0,
            **spec,
        }

    def start(self) -> Job:
        self.service.submit(self.spec)
        return self

    def running(self) -> bool:
        return self.service.alive() and not Path(self.spec["result"]).exists()

    def said(self) -> str:
        path = Path(self.spec["log"])
        return path.read_text(errors="replace") if path.exists() else ""

    def newest_checkpoint(self) -> int:
        done = [int(p.parent.name[4:]) for p in (self.root / "chk").glob("chk-*/_metadata")]
        return max(done, default=0)

    def finish(self) -> dict[str, Any]:
        """Wait for the job; its JSON result (the test fails with the logs if it failed)."""
        service = self.service
        try:
            wait_for(lambda: not self.running(), DRIVER_TIMEOUT, "the job to end")
        except ClusterError:
            service.stop()  # the next test gets a new driver
            pytest.fail(f"the job did not end\n{self.said()[-6000:]}")
        driver_log = service.log.read_text(errors="replace")[-6000:]
        assert service.alive(), f"the driver died\n{driver_log}"
        result: dict[str, Any] = json.loads(Path(self.spec["result"]).read_text())
        assert "error" not in result, (
            f"{result['error']}\n{self.said()[-6000:]}\n{driver_log}\n{service.env.cluster.logs()}"
        )
        return result

    def files(self) -> list[list[int]]:
        """The FileSink's records, every part file, sorted."""
        rows = []
        for part in sorted((self.root / "files").glob("part-*")):
            rows += [json.loads(line) for line in part.read_text().splitlines()]
        return sorted(rows)


def dashboard_job(env: HostCluster, port: int = 8081) -> dict[str, Any] | None:
    """The newest job on the driver's dashboard (its REST API on 127.0.0.1 of host drv,
    asked from that host), or None."""
    url = f"http://127.0.0.1:{port}/api/jobs"
    fetch = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())"
    done = subprocess.run(
        env.hosts["drv"].argv(sys.executable, "-c", fetch, url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        return None
    jobs: list[dict[str, Any]] = json.loads(done.stdout)["jobs"]
    return jobs[-1] if jobs else None


@dataclass(frozen=True)
class HostPostgres:
    """A PostgreSQL server on host drv: ``dsn`` reaches it from the hosts (TCP to drv's
    address), ``local`` from the test process (its Unix socket)."""

    dsn: str
    local: str

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.local, autocommit=True) as conn:
            cur = conn.execute(sql)
            return list(cur.fetchall()) if cur.description else []


@pytest.fixture(scope="module")
def host_postgres(hosts: HostCluster) -> Iterator[HostPostgres]:
    """pgserver's PostgreSQL binaries, run as its system user on host drv, listening on
    drv's address (and a Unix socket in its data directory), two-phase commit on."""
    from pgserver._commands import POSTGRES_BIN_PATH
    from pgserver.utils import ensure_user_exists

    commands: Any = importlib.import_module("pgserver._commands")  # made at import time

    user = ensure_user_exists("pgserver")
    assert user is not None
    # in /tmp itself (the tests' own temp dirs are private): the server's user reaches it
    root = Path(tempfile.mkdtemp(prefix="afh-pg-", dir="/tmp"))
    root.chmod(0o755)
    data = root / "data"
    data.mkdir(mode=0o700)
    os.chown(data, user.pw_uid, user.pw_gid)
    proc: subprocess.Popen[bytes] | None = None
    try:
        commands.initdb(
            ["--auth=trust", "--encoding=utf8", "-U", "postgres"], pgdata=data, user="pgserver"
        )
        with open(data / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {hosts.hosts['drv'].ip.rsplit('.', 1)[0]}.0/24 trust\n")
        drv = hosts.hosts["drv"]
        server = [str(POSTGRES_BIN_PATH / "postgres"), "-D", str(data), "-h", drv.ip]
        server += ["-p", "5432", "-k", str(data), "-c", "max_prepared_transactions=64"]
        with open(root / "server.log", "ab") as out:
            proc = subprocess.Popen(
                drv.argv("runuser", "-u", "pgserver", "--", *server),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        pg = HostPostgres(
            f"postgresql://postgres@{drv.ip}:5432/postgres",
            f"postgresql://postgres@/postgres?host={data}&port=5432",
        )

        def up() -> bool:
            assert proc is not None and proc.poll() is None, (root / "server.log").read_text()
            try:
                pg.query("SELECT 1")
            except Exception:
                return False
            return True

        wait_for(up, 60.0, "PostgreSQL on host drv")
        yield pg
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # a fast shutdown: every backend ends
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)
