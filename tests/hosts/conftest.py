"""The ``hosts`` fixture: five network namespaces on one bridge (a Spark master on ``m``,
the driver on ``drv``, one worker of 2 slots on each of ``a``, ``b``, ``c``), shared by a
module's tests, removed with every process afterwards even when a test failed; and
`Driver`, a job's driver process on ``drv``."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import subprocess
import sys
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


def task_pids(ns: str, driver_ip: str) -> list[int]:
    """The absflow task processes of namespace ``ns``: Python processes with a TCP
    connection to the driver (the job manager's port; Spark's own Python workers talk
    to their executor over loopback only)."""
    ours = []
    for pid in netns_pids(ns):
        try:
            if not Path(f"/proc/{pid}/comm").read_text().startswith("python"):
                continue
            inodes = {
                os.readlink(fd)[8:-1]
                for fd in glob.glob(f"/proc/{pid}/fd/*")
                if os.readlink(fd).startswith("socket:[")
            }
            rows = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
        except OSError:
            continue  # gone meanwhile
        want = "".join(f"{int(x):02X}" for x in reversed(driver_ip.split(".")))
        for row in rows:
            f = row.split()
            if f[3] == "01" and f[9] in inodes and f[2].startswith(want + ":"):
                ours.append(pid)
                break
    return ours


class Driver:
    """One job's driver on host ``drv`` (hosts_job.py), its output under ``root``."""

    def __init__(self, env: HostCluster, root: Path, **spec: Any) -> None:
        self.env, self.root = env, root
        self.spec = {
            "master": env.cluster.url,
            "host": env.driver,
            "pythonpath": str(ROOT),
            "checkpoint_dir": str(root / "chk"),
            "files": str(root / "files"),
            "result": str(root / "result.json"),
            "records": 30_000,
            "rate": 3_000.0,
            "heartbeat_timeout": 15.0,
            "pipeline": "count",
            **spec,
        }
        self.log = root / "driver.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Driver:
        drv = self.env.hosts["drv"]
        environ = dict(
            self.env.cluster.env(drv), PYSPARK_PYTHON=sys.executable, PYTHONPATH=str(ROOT)
        )
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                drv.argv(sys.executable, JOB, json.dumps(self.spec)),
                env=environ,
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def said(self) -> str:
        return self.log.read_text(errors="replace")

    def newest_checkpoint(self) -> int:
        done = [int(p.parent.name[4:]) for p in (self.root / "chk").glob("*/chk-*/_metadata")]
        done += [int(p.parent.name[4:]) for p in (self.root / "chk").glob("chk-*/_metadata")]
        return max(done, default=0)

    def finish(self) -> dict[str, Any]:
        """Wait for the driver; its JSON result (the test fails with its log if it failed)."""
        assert self.proc is not None
        try:
            self.proc.wait(timeout=DRIVER_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the driver did not end\n{self.said()[-6000:]}")
        assert self.proc.returncode == 0, (
            f"{self.said()[-8000:]}\n{self.env.cluster.logs()}"
        )
        result: dict[str, Any] = json.loads((self.root / "result.json").read_text())
        return result

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9)
            self.proc.wait(timeout=30)

    def files(self) -> list[list[int]]:
        """The FileSink's records, every part file, sorted."""
        rows = []
        for part in sorted((self.root / "files").glob("part-*")):
            rows += [json.loads(line) for line in part.read_text().splitlines()]
        return sorted(rows)
