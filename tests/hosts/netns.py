"""Hosts as Linux network namespaces, and a Spark standalone cluster across them.

`Hosts` makes one network namespace per host (loopback up, one veth ``eth0`` with an
address of 198.18.0.0/24, the benchmarking range of RFC 2544) and a bridge in the root
namespace that joins the veths' other ends. The bridge has no address: the test process
in the root namespace is on none of these networks, and no route leads anywhere but to
the namespaces, so every byte a job sends crosses a host boundary. Processes run "on" a
host with ``ip netns exec``; ``partition`` takes a host's link down, ``slow_link`` puts
netem delay and loss on it, ``kill_host`` SIGKILLs every process of its namespace
(``ip netns pids``: a machine that lost power). ``remove`` kills every process of every
namespace, then deletes the namespaces (their veths go with them) and the bridge.

`NamespaceCluster` runs a Spark master on one host and a worker on each of the others,
every daemon bound to and advertising its host's address (``--host``, SPARK_LOCAL_IP),
never 0.0.0.0. Root (CI is) and iproute2 are needed; `unavailable` says why not.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tests.integration.standalone import (
    MASTER,
    WORKER,
    ClusterError,
    Daemon,
    spark_home,
    wait_for,
)

SUBNET = "198.18.0"
# Five JVMs (a master, three workers, the driver) start at once on a shared 2-core machine.
START_TIMEOUT = 300.0
WIRE = str(Path(__file__).resolve().parent / "wire.py")
PREFIX = "afh"  # every namespace, bridge and veth of these tests: afh<pid>...


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    run("ip", "netns", "del", probe, check=False)
    return None


def _stop_wire(wire: subprocess.Popen[str]) -> str:
    """End a wire (its TAP device goes with it); its last words: counts or an error."""
    if wire.poll() is None:
        wire.terminate()
    out, err = wire.communicate(timeout=30)
    return (out.strip().splitlines() or [""])[-1] if wire.returncode == 0 else err.strip()


def netns_pids(ns: str) -> list[int]:
    out = run("ip", "netns", "pids", ns, check=False).stdout
    return [int(p) for p in out.split()]


def remove_stale() -> None:
    """Namespaces and bridges of an earlier test session that died before its teardown
    (its pid, in their names, is gone)."""
    for line in run("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        owner = name[len(PREFIX) :].split("-")[0]
        if name.startswith(PREFIX) and owner.isdigit() and not Path(f"/proc/{owner}").exists():
            for pid in netns_pids(name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            run("ip", "netns", "del", name, check=False)
    for line in run("ip", "-o", "link", "show", "type", "bridge", check=False).stdout.splitlines():
        name = line.split(":")[1].strip()
        owner = name[len(PREFIX) :].rstrip("br")
        if name.startswith(PREFIX) and owner.isdigit() and not Path(f"/proc/{owner}").exists():
            run("ip", "link", "del", name, check=False)


@dataclass(frozen=True)
class Host:
    name: str  # short: "drv", "a", ...
    ns: str  # the namespace
    ip: str
    veth: str  # the veth's end on the bridge (root namespace)
    tap: str  # the wire's end on the bridge while the link is slow without netem

    def argv(self, *cmd: str) -> list[str]:
        """``cmd`` run on this host."""
        return ["ip", "netns", "exec", self.ns, *cmd]


@dataclass
class Hosts:
    """Hosts named ``names`` (the n-th gets 198.18.0.<n+1>), on one bridge."""

    names: Sequence[str]
    tag: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}")
    hosts: dict[str, Host] = field(default_factory=dict)
    wires: dict[str, subprocess.Popen[str]] = field(default_factory=dict)

    @property
    def bridge(self) -> str:
        return f"{self.tag}br"

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def create(self) -> Hosts:
        remove_stale()
        try:
            run("ip", "link", "add", self.bridge, "type", "bridge")
            run("ip", "link", "set", self.bridge, "up")
            for i, name in enumerate(self.names):
                host = Host(
                    name,
                    f"{self.tag}-{name}",
                    f"{SUBNET}.{i + 1}",
                    f"{self.tag}v{i}",
                    f"{self.tag}w{i}",
                )
                run("ip", "netns", "add", host.ns)
                self.hosts[name] = host
                run(*host.argv("ip", "link", "set", "lo", "up"))
                run(
                    "ip",
                    "link",
                    "add",
                    host.veth,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    host.ns,
                )
                run("ip", "link", "set", host.veth, "master", self.bridge, "up")
                run(*host.argv("ip", "addr", "add", f"{host.ip}/24", "dev", "eth0"))
                run(*host.argv("ip", "link", "set", "eth0", "up"))
        except BaseException:
            self.remove()
            raise
        return self

    # -- faults ------------------------------------------------------------------------
    def partition(self, name: str, down: bool) -> None:
        """Take host ``name``'s link down (nothing reaches it, it reaches nothing) or up."""
        run("ip", "link", "set", self.hosts[name].veth, "down" if down else "up")

    def slow_link(self, name: str, slow: bool) -> str:
        """Make host ``name``'s link slow and lossy in both directions (``slow``): 50 ms
        delay and 1 % loss each way; or whole again. Returns what shapes it: netem's
        ``delay 50ms loss 1%`` on both ends where the kernel has sch_netem (a module some
        kernels leave out); where it has not, the same delay and loss from a user-space
        wire (``tests/hosts/wire.py``) put between the host's veth and the bridge. Taking
        the link whole again returns the wire's count of frames passed and dropped."""
        host = self.hosts[name]
        ends = [
            [*host.argv("tc"), "qdisc", "%s", "dev", "eth0", "root"],
            ["tc", "qdisc", "%s", "dev", host.veth, "root"],
        ]
        if not slow:
            wire = self.wires.pop(name, None)
            if wire is None:
                for argv in ends:
                    run(*[a.replace("%s", "del") for a in argv], check=False)
                return ""
            counts = _stop_wire(wire)
            run("ip", "link", "set", host.veth, "master", self.bridge, "up")
            return counts
        netem = "netem delay 50ms loss 1%"
        done = [
            run(*[a.replace("%s", "replace") for a in argv], *netem.split(), check=False)
            for argv in ends
        ]
        if all(d.returncode == 0 for d in done):
            return netem
        for argv in ends:
            run(*[a.replace("%s", "del") for a in argv], check=False)
        self.wires[name] = self._wire(host, delay_ms=50, loss_percent=1)
        return "wire delay 50ms loss 1% (user space: this kernel has no sch_netem)"

    def _wire(self, host: Host, delay_ms: float, loss_percent: float) -> subprocess.Popen[str]:
        """Take ``host``'s veth off the bridge and put a wire between them."""
        run("ip", "link", "set", host.veth, "nomaster")
        argv = [sys.executable, WIRE, host.veth, host.tap, str(delay_ms), str(loss_percent), "7"]
        wire = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert wire.stdout is not None
        if wire.stdout.readline().strip() != "ready":  # "" once it died
            error = _stop_wire(wire)
            run("ip", "link", "set", host.veth, "master", self.bridge, "up")
            raise ClusterError(f"the wire to {host.name} did not start: {error}")
        run("ip", "link", "set", host.tap, "master", self.bridge, "up")
        return wire

    def kill_host(self, name: str) -> list[int]:
        """SIGKILL every process of host ``name``'s namespace; returns once all are gone."""
        ns = self.hosts[name].ns
        killed = netns_pids(ns)
        for pid in killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not netns_pids(ns), 10.0, f"every process of {ns} to die")
        return killed

    # -- teardown -----------------------------------------------------------------------
    def leftovers(self) -> list[str]:
        """Namespaces, links and processes of these hosts that still exist."""
        left = [
            line.split()[0]
            for line in run("ip", "netns", "list", check=False).stdout.splitlines()
            if line.startswith(self.tag)
        ]
        links = run("ip", "-o", "link", "show", check=False).stdout
        left += [
            f"link {n}"
            for n in (self.bridge, *(n for h in self.hosts.values() for n in (h.veth, h.tap)))
            if f" {n}:" in links or f" {n}@" in links
        ]
        return left

    def remove(self) -> None:
        """Kill every process of every namespace, delete the veths, the namespaces and the
        bridge. The veths go first and explicitly: a namespace outlives its deletion
        while a socket of a killed process still holds it (an orphaned TCP connection
        retransmitting to a peer that is gone, for minutes), and its veth with it."""
        for wire in self.wires.values():
            _stop_wire(wire)
        self.wires.clear()
        for host in self.hosts.values():
            with contextlib.suppress(ClusterError):
                self.kill_host(host.name)
        for host in self.hosts.values():
            run("ip", "link", "del", host.veth, check=False)
            run("ip", "netns", "del", host.ns, check=False)
        run("ip", "link", "del", self.bridge, check=False)


class NamespaceCluster:
    """A Spark master on host ``master`` and one worker of ``cores`` slots on each of
    ``workers``; every daemon binds its host's address only."""

    def __init__(
        self,
        hosts: Hosts,
        root: Path,
        master: str,
        workers: Sequence[str],
        cores: int = 2,
        memory: str = "1g",
    ) -> None:
        self.hosts, self.root = hosts, root
        self.master_host, self.worker_hosts = hosts[master], [hosts[w] for w in workers]
        self.cores, self.memory = cores, memory
        self.master: Daemon | None = None
        self.workers: dict[str, Daemon] = {}
        self._count = 0

    @property
    def url(self) -> str:
        return f"spark://{self.master_host.ip}:7077"

    def env(self, host: Host) -> dict[str, str]:
        """The environment of a daemon (or driver) on ``host``."""
        conf = self.root / "conf"
        conf.mkdir(parents=True, exist_ok=True)  # empty: no host-wide spark-defaults
        local = self.root / "local" / host.name
        local.mkdir(parents=True, exist_ok=True)
        return dict(
            os.environ,
            SPARK_HOME=spark_home(),
            SPARK_CONF_DIR=str(conf),
            SPARK_LOCAL_IP=host.ip,
            SPARK_PUBLIC_DNS=host.ip,
            SPARK_LOCAL_DIRS=str(local),
            SPARK_DAEMON_MEMORY="256m",
            SPARK_DAEMON_JAVA_OPTS="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        )

    def spawn(self, host: Host, name: str, argv: list[str], env: dict[str, str]) -> Daemon:
        log = self.root / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        out: IO[bytes]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                host.argv(*argv),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return Daemon(name, proc, log, argv)

    def state(self) -> dict[str, Any]:
        """The master's JSON page, read from the master's own host; {} while it does not
        answer."""
        url = f"http://{self.master_host.ip}:8080/json/"
        fetch = "import sys, urllib.request as u; print(u.urlopen(sys.argv[1], timeout=2).read().decode())"
        got = run(*self.master_host.argv(sys.executable, "-c", fetch, url), check=False)
        try:
            data: dict[str, Any] = json.loads(got.stdout) if got.returncode == 0 else {}
        except ValueError:
            return {}
        return data

    def alive(self) -> list[str]:
        """Hosts (addresses) of the ALIVE workers."""
        return [w["host"] for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]

    def start(self) -> NamespaceCluster:
        spark_class = os.path.join(spark_home(), "bin", "spark-class")
        host = self.master_host
        self.master = self.spawn(
            host,
            "master",
            [spark_class, MASTER, "--host", host.ip, "--port", "7077", "--webui-port", "8080"],
            self.env(host),
        )
        wait_for(lambda: "workers" in self.state(), START_TIMEOUT, "the master's web UI")
        for worker in self.worker_hosts:
            self.start_worker(worker.name, wait=False)
        self.wait_alive({w.ip for w in self.worker_hosts})
        return self

    def start_worker(self, name: str, wait: bool = True) -> Daemon:
        """A worker on host ``name`` (again, after the host was lost)."""
        host = self.hosts[name]
        self._count += 1
        work = self.root / f"worker-{name}-{self._count}"
        work.mkdir(parents=True, exist_ok=True)
        spark_class = os.path.join(spark_home(), "bin", "spark-class")
        argv = [
            spark_class,
            WORKER,
            "--host",
            host.ip,
            "--webui-port",
            "8081",
            "--cores",
            str(self.cores),
            "--memory",
            self.memory,
            "--work-dir",
            str(work),
            self.url,
        ]
        self.workers[name] = self.spawn(host, f"worker-{name}-{self._count}", argv, self.env(host))
        if wait:
            self.wait_alive({*self.alive(), host.ip})
        return self.workers[name]

    def wait_alive(self, ips: set[str], timeout: float = START_TIMEOUT) -> None:
        wait_for(lambda: set(self.alive()) == ips, timeout, f"ALIVE workers on {sorted(ips)}")

    def logs(self, tail: int = 2000) -> str:
        daemons = [*self.workers.values(), *([self.master] if self.master else [])]
        return "\n".join(f"--- {d.name} ---\n{d.log.read_text()[-tail:]}" for d in daemons)
