"""The REST API: a GET path and query to a JSON answer, read from the jobs' latest
snapshots only (``jobmanager.web.snapshot``). Pure: no sockets, so tests call it directly.

Every answer is ``(status, body)``; errors are ``{"error": "..."}`` with 400 (a malformed
query value or an unknown parameter), 404 (an unknown path or job) — never a traceback.
``API`` is the one table of endpoints (path, parameters, what the answer holds): the
dispatcher reads it, and the docs' REST table (docs/monitoring.md) is generated from it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qs

from jobmanager.web.snapshot import JobBoard, JobSnapshot

Answer = tuple[int, object]  # status, the JSON body (json.dumps takes it as it is)

MAX_LIMIT = 1000


class BadRequest(Exception):
    """A query the API refuses (400)."""


class NotFound(Exception):
    """An unknown path or job (404)."""


class Jobs(Mapping[str, JobBoard]):
    """The jobs a server shows, oldest first; the newest is the default ``job``."""

    def __init__(self) -> None:
        self._boards: dict[str, JobBoard] = {}

    def add(self, board: JobBoard, keep: int = 20) -> None:
        self._boards[board.job_id] = board
        while len(self._boards) > keep:  # a long-lived driver: forget the oldest jobs
            del self._boards[next(iter(self._boards))]

    def __getitem__(self, job_id: str) -> JobBoard:
        return self._boards[job_id]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._boards))

    def __len__(self) -> int:
        return len(self._boards)

    def pick(self, job_id: str | None) -> JobBoard:
        boards = list(self._boards.values())
        if job_id is None:
            if not boards:
                raise NotFound("no job has run in this driver yet")
            return boards[-1]
        board = self._boards.get(job_id)
        if board is None:
            raise NotFound(f"no job {job_id!r}; jobs: {list(self._boards)} (see /api/jobs)")
        return board


def parse_query(query: str, allowed: tuple[str, ...]) -> dict[str, str]:
    """One value per known parameter; unknown or repeated parameters are refused."""
    try:
        values = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as err:
        raise BadRequest(f"malformed query string {query!r}: {err}") from None
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        known = ", ".join(allowed) or "none"
        raise BadRequest(f"unknown query parameter(s) {unknown}; this endpoint takes: {known}")
    out = {}
    for key, vals in values.items():
        if len(vals) != 1:
            raise BadRequest(f"query parameter {key!r} is given {len(vals)} times; give it once")
        out[key] = vals[0]
    return out


def int_param(params: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"query parameter {name}={raw!r} is not an integer") from None
    if not low <= value <= high:
        raise BadRequest(f"query parameter {name}={value} is out of range [{low}, {high}]")
    return value


def _snapshot(board: JobBoard) -> JobSnapshot:
    snap = board.latest
    if snap is None:
        raise NotFound(f"job {board.job_id!r} has not published its state yet; retry shortly")
    return snap


TaskFigure = Literal[
    "bytes_in",
    "bytes_out",
    "backpressure_seconds",
    "input_queue",
    "output_queue",
    "refused_connections",
    "malformed_frames",
]
"""The task figures ``/metrics`` sums over the tasks."""


def _jobs(jobs: Jobs, params: Mapping[str, str]) -> Mapping[str, object]:
    return {
        "jobs": [
            dict(b.latest.job)
            if b.latest
            else {"id": b.job_id, "name": b.name, "state": "starting"}
            for b in (jobs[j] for j in jobs)
        ]
    }


def _job(board: JobBoard, params: Mapping[str, str]) -> Mapping[str, object]:
    return dict(_snapshot(board).job)


def _plan(board: JobBoard, params: Mapping[str, str]) -> Mapping[str, object]:
    return board.plan


def _config(board: JobBoard, params: Mapping[str, str]) -> Mapping[str, object]:
    return {"job": board.job_id, "config": board.config}


def _tasks(board: JobBoard, params: Mapping[str, str]) -> Mapping[str, object]:
    snap = _snapshot(board)
    return {"job": board.job_id, "attempt": snap.job["attempt"], "tasks": list(snap.tasks)}


def _checkpoints(board: JobBoard, params: Mapping[str, str]) -> Mapping[str, object]:
    snap = _snapshot(board)
    limit = int_param(params, "limit", 100, 1, MAX_LIMIT)
    since = int_param(params, "since", 0, 0, 2**62)
    completed = [c for c in snap.checkpoints if c["checkpoint_id"] > since][-limit:]
    return {
        "job": board.job_id,
        "completed": completed,
        "failed": [f for f in snap.failed_checkpoints if f["checkpoint_id"] > since][-limit:],
        "pending": snap.job["checkpoints_pending"],
        "last_completed_id": snap.job["last_checkpoint_id"],
    }


def _restarts(board: JobBoard, params: Mapping[str, str]) -> Mapping[str, object]:
    snap = _snapshot(board)
    limit = int_param(params, "limit", 100, 1, MAX_LIMIT)
    return {"job": board.job_id, "restarts": list(snap.restarts)[-limit:]}


def _metrics(board: JobBoard, params: Mapping[str, str]) -> Mapping[str, object]:
    """Job-level sums of the task figures and the checkpoint duration histogram."""
    snap = _snapshot(board)
    tasks = snap.tasks

    def total(key: TaskFigure) -> float:
        return sum(t[key] for t in tasks)

    return {
        "job": board.job_id,
        "records_in": snap.job["records_in"],
        "records_out": snap.job["records_out"],
        "records_in_per_second": sum(t["records_in_per_second"] for t in tasks if t["source"]),
        "records_out_per_second": sum(t["records_out_per_second"] for t in tasks if t["sink"]),
        "bytes_in": total("bytes_in"),
        "bytes_out": total("bytes_out"),
        "backpressure_seconds": round(total("backpressure_seconds"), 6),
        "input_queue": total("input_queue"),
        "output_queue": total("output_queue"),
        "checkpoints_completed": snap.job["checkpoints_completed"],
        "checkpoints_failed": snap.job["checkpoints_failed"],
        "last_checkpoint_id": snap.job["last_checkpoint_id"],
        "restarts": snap.job["restarts"],
        "refused_connections": snap.job["refused_connections"] + total("refused_connections"),
        "malformed_frames": total("malformed_frames"),
        "checkpoint_duration_ms": {
            "sum": round(snap.duration_sum_ms, 3),
            "count": sum(snap.duration_buckets),
        },
    }


def _iteration(board: JobBoard, params: Mapping[str, str]) -> Mapping[str, object]:
    snap = _snapshot(board)
    return {
        "job": board.job_id,
        "iteration": None if snap.iteration is None else dict(snap.iteration),
    }


def _overview(board: JobBoard, params: Mapping[str, str]) -> Mapping[str, object]:
    """What the dashboard polls: job, tasks, checkpoints, restarts in one answer."""
    return {
        "job": _job(board, {}),
        "tasks": _tasks(board, {})["tasks"],
        "checkpoints": _checkpoints(board, params),
        "restarts": _restarts(board, {})["restarts"],
        "iteration": _iteration(board, {})["iteration"],
    }


Handler = Callable[[JobBoard, Mapping[str, str]], Mapping[str, object]]


@dataclass(frozen=True)
class Endpoint:
    """One ``GET /api/<name>`` endpoint: its handler, the query parameters it takes and a
    one-line description of its answer (rendered into the docs' REST table)."""

    name: str
    handler: Handler | None  # None: /api/jobs, which answers for every job, not one board
    params: tuple[str, ...]
    description: str

    @property
    def path(self) -> str:
        return f"/api/{self.name}"


API: tuple[Endpoint, ...] = (
    Endpoint("jobs", None, (), "`jobs`: every job of this driver (the `/api/job` object each)"),
    Endpoint(
        "job",
        _job,
        ("job",),
        "id, name, state (starting, running, restarting, finished, failed), error, message "
        "(what a restarting job waits for, e.g. task slots), attempt, start time, "
        "duration, records in/out, tasks, checkpoint counts and pending ids, restarts, UI URL",
    ),
    Endpoint(
        "plan", _plan, ("job",), "the physical plan: steps, chains, tasks, channels, back-edges"
    ),
    Endpoint(
        "config",
        _config,
        ("job",),
        "the job's settings (`storage_options` left out: they may hold credentials)",
    ),
    Endpoint(
        "tasks",
        _tasks,
        ("job",),
        "per task: host, pid, state, records and bytes in/out and their rates, backpressure, "
        "busy share, input/output queues, RSS, uptime, watermark, time paused by watermark "
        "alignment",
    ),
    Endpoint(
        "metrics",
        _metrics,
        ("job",),
        "job-level sums of the task figures and the checkpoint duration sum and count",
    ),
    Endpoint(
        "checkpoints",
        _checkpoints,
        ("job", "limit", "since"),
        "completed checkpoints (oldest first; duration, sizes, alignment and start delay, per "
        "task figures), failed ones with their reason, pending ids; `limit` 1..1000 "
        "(default 100), `since` a checkpoint id",
    ),
    Endpoint(
        "restarts",
        _restarts,
        ("job", "limit"),
        "per restart: the failed attempt, cause, error, restored checkpoint, recovery seconds",
    ),
    Endpoint(
        "iteration",
        _iteration,
        ("job",),
        "a superstep iteration's progress (null for other jobs): phase, the superstep running, "
        "supersteps done and started, convergence aggregate per superstep, superstep "
        "checkpoints, recoveries and supersteps re-run",
    ),
    Endpoint(
        "overview",
        _overview,
        ("job", "limit", "since"),
        "job, tasks, checkpoints, restarts and the iteration in one answer (what the "
        "dashboard polls)",
    ),
)
_PER_JOB: dict[str, tuple[Handler, tuple[str, ...]]] = {
    e.name: (e.handler, e.params) for e in API if e.handler is not None
}
ENDPOINTS = tuple(e.name for e in API)


def answer(jobs: Jobs, path: str, query: str) -> Answer:
    """The API's answer to ``GET /api/<path>?<query>``."""
    name = path.strip("/")
    try:
        if name == "jobs":
            return 200, _jobs(jobs, parse_query(query, ()))
        entry = _PER_JOB.get(name)
        if entry is None:
            raise NotFound(
                f"no endpoint /api/{name}; endpoints: {', '.join('/api/' + e for e in ENDPOINTS)}"
            )
        handler, allowed = entry
        params = parse_query(query, allowed)
        return 200, handler(jobs.pick(params.get("job")), params)
    except BadRequest as err:
        return 400, {"error": str(err)}
    except NotFound as err:
        return 404, {"error": str(err)}
