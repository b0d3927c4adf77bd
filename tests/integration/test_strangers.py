"""A stranger on the network against a running job (issue 42, item 4), on the harness.

A foreign ZeroMQ socket of this process connects to the job manager's port and to a sink
task's gate, found as a scanning stranger would find them (the listening and connected
TCP sockets of the job's processes, from /proc), and sends (a) a well-formed data frame
in the job's wire format, (b) forged acks of a pending checkpoint, (c) garbage. The job
holds every source at one record meanwhile (a map that waits for a flag file), so a
checkpoint is pending and the job runs while the stranger acts.

With ``secure_channels`` the output equals the input record for record, the pending
checkpoint is not completed while the sources are held, no restart happens, and the job
manager and the task count the refused connections. The companions without it show the
attack landing (so these tests can fail): the injected record in the output, a
checkpoint completed by forged acks while no source had taken it; and garbage is dropped
and counted, never a restart.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from channels.messages import encode_data
from channels.security import ChannelKeys
from jobmanager.result import JobResult
from jobmanager.web import DashboardServer
from runtime import Dataflow
from runtime import control as P
from runtime.api.testing import ListSink, TestingSource, run_local
from statebackend.metrics import AckMetrics

pytestmark = [
    pytest.mark.harness,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for ports"),
]

N = 4000
INJECTED = -7  # the stranger's record (the job's records are 0..N-1)
HEARTBEAT_TIMEOUT = 120.0  # a held source task sends no heartbeat: not a failure here
GARBAGE = [b"", b"\x01", b"\xff" * 3, os.urandom(64), b"\x00\x00\x00\x00\x00\xc1\xc1"]


class Hold:
    """Waits at the records ``at`` until ``flag`` exists (the sources stay put while the
    stranger acts; the task does not heartbeat meanwhile: see HEARTBEAT_TIMEOUT)."""

    def __init__(self, flag: str, at: frozenset[int]) -> None:
        self.flag, self.at = flag, at

    def __call__(self, x: int) -> int:
        if x in self.at:
            while not os.path.exists(self.flag):
                time.sleep(0.005)
        return x


def held_job(flag: str, out: list[Any]) -> Dataflow:
    flow = Dataflow(f"strangers-{uuid.uuid4().hex[:6]}", parallelism=2)
    (
        flow.source(TestingSource(list(range(N))), name="numbers")
        .map(Hold(flag, frozenset({N // 2, N // 2 + 1})), name="hold")
        .rebalance()
        .sink(ListSink(out), name="out")
    )
    return flow


# -- what a stranger can see ---------------------------------------------------------------
def tcp_sockets(pid: int) -> list[tuple[int, int, str]]:
    """(local port, remote port, state) of every TCP socket process ``pid`` holds."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as fh:
            next(fh)
            for line in fh:
                parts = line.split()
                if parts[9] in inodes:
                    local, remote = (int(a.rsplit(":", 1)[1], 16) for a in parts[1:3])
                    found.append((local, remote, "LISTEN" if parts[3] == "0A" else parts[3]))
    return found


def api(srv: DashboardServer, path: str, job: str) -> Any:
    with urllib.request.urlopen(f"{srv.url}api/{path}?job={job}", timeout=10) as res:
        return json.loads(res.read())


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


class Stranger:
    """Foreign sockets (plain ZeroMQ, no keys) of this process; closed by ``close``."""

    def __init__(self) -> None:
        self.zctx: zmq.Context[Any] = zmq.Context()
        self.sockets: list[zmq.Socket[Any]] = []

    def send(self, kind: int, host: str, port: int, frames: list[bytes]) -> None:
        """Connect and queue ``frames`` (libzmq queues them before the handshake: with
        secure_channels the handshake fails and they never leave)."""
        sock = self.zctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"tcp://{host}:{port}")
        for frame in frames:
            sock.send(frame, zmq.NOBLOCK)
        self.sockets.append(sock)

    def close(self) -> None:
        for sock in self.sockets:
            sock.close(linger=0)
        self.zctx.term()


class RunningJob:
    """The held job on a thread, its dashboard, its ports and a stranger."""

    def __init__(
        self,
        srv: DashboardServer,
        tmp: Path,
        secure: bool,
        launcher: str = "local",
        **config: Any,
    ) -> None:
        self.srv, self.flag = srv, str(tmp / "release")
        self.out: list[int] = []
        flow = held_job(self.flag, self.out)
        self.result: JobResult | None = None
        self.error: BaseException | None = None
        options = dict(
            secure_channels=secure,
            checkpoint_interval=0.2,
            ui_port=srv.port,
            timeout=120,
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            launcher=launcher,
            **config,
        )
        self.thread = threading.Thread(target=self._run, args=(flow, options), daemon=True)
        self.thread.start()
        self.job = wait_for("the job on the dashboard", lambda: self._job_id(flow.name))
        self.tasks = wait_for("every task registered", self._registered)
        self.plan = api(srv, "plan", self.job)
        # The job's own address on this machine (127.0.0.1 on the harness; on local Spark
        # the driver's, where the job manager binds too): the stranger goes nowhere else.
        self.host = self.tasks[0]["host"]
        self.pending = wait_for("a checkpoint pending while the sources are held", self._held)
        self.stranger = Stranger()

    def _run(self, flow: Dataflow, options: dict[str, Any]) -> None:
        try:
            local = options["launcher"] == "local"
            self.result = run_local(flow, **options) if local else flow.run(**options)
        except BaseException as err:
            self.error = err

    def _job_id(self, name: str) -> str | None:
        with urllib.request.urlopen(f"{self.srv.url}api/jobs", timeout=10) as res:
            jobs = json.loads(res.read())["jobs"]
        return next((j["id"] for j in jobs if j["name"] == name), None)

    def _registered(self) -> list[Any] | None:
        tasks = api(self.srv, "tasks", self.job)["tasks"]
        return tasks if tasks and all(t["pid"] for t in tasks) else None

    def _held(self) -> int | None:
        pending = api(self.srv, "checkpoints", self.job)["pending"]
        return pending[0] if pending else None

    # -- the job's ports -------------------------------------------------------------------
    def sink_gate(self) -> tuple[int, int]:
        """(task index, gate port) of a sink task: the port it listens on (as the
        dashboard shows it; a stranger would find it listening)."""
        sink = next(t for t in self.tasks if t["sink"])
        port = int(sink["endpoint"].rsplit(":", 1)[1])
        listening = [lo for lo, _r, state in tcp_sockets(sink["pid"]) if state == "LISTEN"]
        assert port in listening, f"sink task {sink['task_id']} listens on {listening}"
        return sink["index"], port

    def jm_port(self) -> int:
        """The job manager's port: where a task is connected to, that this process listens on."""
        ours = {lo for lo, _r, state in tcp_sockets(os.getpid()) if state == "LISTEN"}
        task = self.tasks[0]["pid"]
        ports = {r for _lo, r, state in tcp_sockets(task) if state == "01" and r in ours}
        assert len(ports) == 1, f"task {task} is connected to these ports of ours: {ports}"
        return ports.pop()

    def input_channel(self, task: int) -> int:
        return int(next(c["id"] for c in self.plan["channels"] if c["target_task"] == task))

    # -- the attacks -----------------------------------------------------------------------
    def inject(self) -> None:
        """(a) a well-formed data frame, (c) garbage: into a sink task's gate."""
        task, port = self.sink_gate()
        frame = encode_data(self.input_channel(task), [INJECTED])
        self.stranger.send(zmq.PUSH, self.host, port, [frame, *GARBAGE])

    def inject_everywhere(self) -> int:
        """``inject`` into every port a sink task listens on (its gate and, with unaligned
        checkpoints, its priority gate); returns how many ports."""
        task, _ = self.sink_gate()
        pid = next(t["pid"] for t in self.tasks if t["index"] == task)
        ports = [lo for lo, _r, state in tcp_sockets(pid) if state == "LISTEN"]
        frame = encode_data(self.input_channel(task), [INJECTED])
        for port in ports:
            self.stranger.send(zmq.PUSH, self.host, port, [frame, *GARBAGE])
        return len(ports)

    def forge_acks(self) -> None:
        """(b) an ack of the pending checkpoint from every task, (c) garbage: to the job
        manager."""
        acks = [
            P.encode(P.Ack(t["index"], 0, self.pending, None, AckMetrics())) for t in self.tasks
        ]
        self.stranger.send(zmq.DEALER, self.host, self.jm_port(), [*acks, *GARBAGE])

    def figures(self) -> dict[str, Any]:
        return {
            "job": api(self.srv, "job", self.job),
            "metrics": api(self.srv, "metrics", self.job),
            "completed": [
                c["checkpoint_id"] for c in api(self.srv, "checkpoints", self.job)["completed"]
            ],
        }

    def prometheus(self) -> dict[str, float]:
        """The counters of /metrics, summed over their labels."""
        with urllib.request.urlopen(f"{self.srv.url}metrics?job={self.job}", timeout=10) as res:
            families = text_string_to_metric_families(res.read().decode())
            return {
                f.name: sum(x.value for x in f.samples if x.name.endswith("_total"))
                for f in families
            }

    def release(self) -> JobResult:
        Path(self.flag).touch()
        self.thread.join(timeout=120)
        self.stranger.close()
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


@pytest.fixture
def running(
    server: DashboardServer, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[RunningJob]:
    job = RunningJob(server, tmp_path, secure=request.param)
    try:
        yield job
    finally:
        Path(job.flag).touch()
        job.thread.join(timeout=120)
        if not job.stranger.zctx.closed:
            job.stranger.close()


@pytest.mark.parametrize("running", [True], indirect=True)
def test_a_stranger_gets_nowhere_with_secure_channels(running: RunningJob) -> None:
    stranger_gets_nowhere(running)


def test_the_secret_keys_stay_off_command_lines_environments_logs_and_the_dashboard(
    server: DashboardServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The keys travel only inside what starts a task (here: its stdin)."""
    made: list[ChannelKeys] = []
    generate = ChannelKeys.generate

    def recorded() -> ChannelKeys:
        made.append(generate())
        return made[-1]

    monkeypatch.setattr(ChannelKeys, "generate", staticmethod(recorded))
    caplog.set_level(logging.DEBUG)
    job = RunningJob(server, tmp_path, secure=True)
    try:
        (keys,) = made
        secrets = (keys.server_secret, keys.client_secret)
        seen = [
            Path(f"/proc/{t['pid']}/{f}").read_bytes()
            for t in job.tasks
            for f in ("cmdline", "environ")
        ]
        for path in ("config", "plan", "tasks", "job", "metrics"):
            seen.append(json.dumps(api(server, path, job.job)).encode())
        seen.append(caplog.text.encode())
        assert not [s for s in secrets for text in seen if s in text]
    finally:
        job.release()


@pytest.mark.integration
def test_on_spark_the_keys_reach_the_tasks_in_the_stage_closure(
    server: DashboardServer, tmp_path: Path
) -> None:
    """The barrier stage's closure carries the keys: CURVE on the rendezvous, the gates and
    the control plane of a Spark job (forced on: the master is local), and a stranger
    refused there too."""
    job = RunningJob(server, tmp_path, secure=True, launcher="spark")
    try:
        stranger_gets_nowhere(job)
    finally:
        Path(job.flag).touch()
        job.thread.join(timeout=120)
        if not job.stranger.zctx.closed:
            job.stranger.close()


def stranger_gets_nowhere(running: RunningJob) -> None:
    running.inject()
    running.forge_acks()
    # Refused at the handshake: once counted, nothing of theirs can still arrive.
    seen = wait_for(
        "the job manager and the sink task refusing the stranger",
        lambda: (
            (f := running.figures())["job"]["refused_connections"] >= 1
            and f["metrics"]["refused_connections"] > f["job"]["refused_connections"]
            and f
        ),
    )
    assert running.pending not in seen["completed"], "a forged ack completed a checkpoint"
    assert seen["metrics"]["malformed_frames"] == 0  # no frame of theirs reached a task
    prom = running.prometheus()
    assert prom["absflow_refused_connections"] >= 1  # the driver's
    assert prom["absflow_task_refused_connections"] >= 1  # the sink task's, by heartbeat
    result = running.release()
    assert sorted(result.output("out")) == list(range(N))  # record for record, none injected
    assert not result.restarts
    assert running.pending in [c.checkpoint_id for c in result.checkpoints] or any(
        c.checkpoint_id > running.pending for c in result.checkpoints
    )


@pytest.mark.parametrize("running", [False], indirect=True)
def test_without_secure_channels_the_strangers_record_lands_and_garbage_is_dropped(
    running: RunningJob,
) -> None:
    running.inject()
    dropped = wait_for(
        "the sink task dropping the garbage",
        lambda: running.figures()["metrics"]["malformed_frames"] >= len(GARBAGE) - 1,
    )
    assert dropped
    result = running.release()
    assert INJECTED in running.out  # the stranger's record is in the job's output
    assert sorted(x for x in running.out if x != INJECTED) == list(range(N))
    assert not result.restarts  # garbage never ends a task


@pytest.mark.parametrize("running", [False], indirect=True)
def test_without_secure_channels_forged_acks_complete_a_checkpoint_never_taken(
    running: RunningJob,
) -> None:
    running.forge_acks()
    wait_for(
        "the forged acks completing the pending checkpoint while every source is held",
        lambda: running.pending in running.figures()["completed"],
    )


def test_without_secure_channels_garbage_on_the_priority_gate_ends_no_task(
    server: DashboardServer, tmp_path: Path
) -> None:
    """Unaligned checkpoints: a sink task also listens on a priority gate (barriers that
    overtake records), decoded apart from the data path; garbage there is dropped too."""
    job = RunningJob(server, tmp_path, secure=False, snapshot_mode="unaligned")
    try:
        assert job.inject_everywhere() == 2
        wait_for(
            "the sink task dropping the garbage of its data gate",
            lambda: job.figures()["metrics"]["malformed_frames"] >= len(GARBAGE) - 1,
        )
    finally:
        result = job.release()
    out = result.output("out")
    assert out.count(INJECTED) == 1  # by the data gate; a data frame never overtakes
    assert sorted(x for x in out if x != INJECTED) == list(range(N))
    assert not result.restarts
