"""Stop with a savepoint at parallelism 2, resume at 1 and at 3: the file source's open
splits and the transactional sinks' old subtasks are redistributed, and the Parquet
files and the Delta table hold exactly what one uninterrupted run writes (local task
processes: the harness; the stop goes through the registry `python -m jobmanager stop`
uses)."""

from __future__ import annotations

import collections
import json
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from jobmanager.stop import request_stop, running_jobs
from runtime import Dataflow
from runtime.api.testing import run_local
from runtime.connectors.delta import DeltaSink
from runtime.connectors.files import FileStreamSource
from runtime.connectors.parquet import ParquetSink
from statebackend.storage import CheckpointStorage
from tests.conftest import Footprint

# one worker runs the module: the uninterrupted run is taken once for both tests
pytestmark = [pytest.mark.harness, pytest.mark.slow, pytest.mark.xdist_group("rescale")]

USERS, LINES = 11, 3000


def write_files(directory: Path, first: int, count: int) -> None:
    directory.mkdir(exist_ok=True)
    for f in range(first, first + count):
        lines = "".join(
            json.dumps({"user": f"u{(f * 7 + i) % USERS}"}) + "\n" for i in range(LINES)
        )
        tmp = directory.parent / f".in-{f}.jsonl"
        tmp.write_text(lines)
        tmp.rename(directory / f"in-{f}.jsonl")  # files appear whole


def slowly(record: dict[str, Any]) -> str:
    time.sleep(0.0003)  # keeps files open while the job is stopped
    return str(record["user"])


def build(name: str, inputs: Path, out: Path, parallelism: int, chk: Path) -> Dataflow:
    flow = Dataflow(
        name, parallelism=parallelism, checkpoint_interval=0.2, checkpoint_dir=str(chk), ui=False
    )
    rows = (
        flow.source(
            FileStreamSource(str(inputs), poll_interval_s=0.05, done_marker="_SUCCESS"),
            name="files",
        )
        .map(slowly, name="user")
        .key_by(lambda u: u)
        .aggregate(0, lambda n, _u: n + 1, name="count")
        .map(lambda kv: {"user": kv[0], "n": kv[1]}, name="row")
    )
    rows.sink(ParquetSink(str(out / "parquet")), name="parquet")
    rows.sink(DeltaSink(str(out / "delta")), name="delta")
    return flow


def written(out: Path) -> tuple[collections.Counter[Any], collections.Counter[Any]]:
    parquet = pq.read_table(str(out / "parquet")).to_pylist()
    delta = DeltaTable(str(out / "delta")).to_pyarrow_table().to_pylist()
    return (
        collections.Counter((r["user"], r["n"]) for r in parquet),
        collections.Counter((r["user"], r["n"]) for r in delta),
    )


def open_files(chk: Path, savepoint: str) -> list[tuple[str, int]]:
    """The files the source subtasks had open in the savepoint, with their offsets."""
    storage, n = CheckpointStorage(str(chk)), int(savepoint.rsplit("chk-", 1)[1])
    found = []
    for handle in storage.check(n).tasks.values():
        if "files" in handle.operators:
            blob = storage.read_operator_state(n, handle, "files")
            state = msgpack.unpackb(blob or b"\xc0", raw=False)
            if state and state["current"] is not None:
                found.append((state["current"], int(state["offset"])))
    return found


def wait_for(condition: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def stop_at_two(name: str, inputs: Path, out: Path, chk: Path) -> str:
    """Run at parallelism 2 until a checkpoint is complete, stop it with a savepoint."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["run"] = build(name, inputs, out, 2, chk).run(launcher="local", progress=False)
        except BaseException as err:  # raised in the test thread below
            result["error"] = err

    thread = threading.Thread(target=run)
    thread.start()
    storage = CheckpointStorage(str(chk))

    def committed() -> bool:
        files = list((out / "parquet").glob("*.parquet")) if (out / "parquet").exists() else []
        return bool(files) and bool(storage.completed_checkpoints())

    try:
        wait_for(lambda: "error" in result or committed(), "a committed checkpoint")
        wait_for(lambda: [j for j in running_jobs() if j.job == name], "the job's registry entry")
        (job,) = [j for j in running_jobs() if j.job == name]
        request_stop(job)
    finally:
        thread.join(timeout=120)
    assert "error" not in result, result.get("error")
    stopped = result["run"]
    assert stopped.stopped and stopped.savepoint
    return str(stopped.savepoint)


@pytest.fixture(scope="module")
def one_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[collections.Counter[Any], collections.Counter[Any]]:
    """What one uninterrupted run at parallelism 2 writes (Parquet, Delta): the same for
    both tests, so run once."""
    root = tmp_path_factory.mktemp("one-run")
    write_files(root / "in", 0, 9)  # the tests' six files, their three more, the end
    (root / "in" / "_SUCCESS").write_text("")
    before = Footprint.take(children=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ABSFLOW_JOBS_DIR", str(root / "jobs"))
        run_local(build("rescale-ref", root / "in", root / "ref", 2, root / "chk"), progress=False)
    problems = before.leftovers().problems()
    assert not problems, "; ".join(problems)
    return written(root / "ref")


@pytest.mark.parametrize("parallelism", [1, 3])
def test_stop_at_two_resume_at_another_parallelism_equals_one_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parallelism: int,
    one_run: tuple[collections.Counter[Any], collections.Counter[Any]],
) -> None:
    monkeypatch.setenv("ABSFLOW_JOBS_DIR", str(tmp_path / "jobs"))
    inputs, out = tmp_path / "in", tmp_path / "out"
    write_files(inputs, 0, 6)
    name = f"rescale-{parallelism}"
    savepoint = stop_at_two(name, inputs, out, tmp_path / "chk")
    read = sum(written(out)[0].values())
    assert 0 < read < 6 * LINES  # stopped mid-run
    assert any(offset > 0 for _, offset in open_files(tmp_path / "chk", savepoint))

    write_files(inputs, 6, 3)  # more files while the job is stopped, then the end
    (inputs / "_SUCCESS").write_text("")
    resumed = build(name, inputs, out, parallelism, tmp_path / "chk2")
    run_local(resumed, restore_from=savepoint, progress=False)

    assert sum(one_run[0].values()) == 9 * LINES
    assert written(out) == one_run  # Parquet and Delta: each row exactly once
