"""Keyed state on the rocksdb backend in real task processes (the harness): a task
SIGKILLed after checkpoints and while its checkpoint is being uploaded, restores at
another parallelism (2 -> 3, 2 -> 1) from a RocksDB checkpoint, and savepoints taken on
one backend resumed on the other; each compared record for record with a failure-free
run, each with a companion showing the check fails when the mechanism is off."""

from __future__ import annotations

import collections
import os
from pathlib import Path
from typing import Any

import pytest

from jobmanager.faults import Kill
from runtime import Dataflow
from runtime.api.testing import run_local
from statebackend import CheckpointStorage
from tests.conftest import FakeS3
from tests.integration.topologies import keyed_sums

pytestmark = [pytest.mark.harness]

KEYS = 3000
N = 40_000
ROCKSDB: dict[str, Any] = {"state_backend": "rocksdb", "state_memory_budget_mb": 8}


@pytest.fixture(scope="module")
def clean() -> list[Any]:
    """The failure-free run's output (in memory, no checkpoints)."""
    return run_local(sums(N)).output("sums")


def sums(n: int, parallelism: int = 2, rate: float | None = None, **config: Any) -> Dataflow:
    return keyed_sums("rocks-sums", n, parallelism, rate, KEYS, **config)


def stored(root: Path) -> list[int]:
    """Completed checkpoints whose 'sum' state is RocksDB files in every task."""
    storage = CheckpointStorage(str(root))
    return [
        n
        for n in storage.completed_checkpoints()
        if all("sum" in h.stores for t, h in storage.check(n).tasks.items() if t.startswith("sum"))
    ]


def test_a_failure_free_run_on_rocksdb_is_exact(tmp_path: Path, clean: list[Any]) -> None:
    root = tmp_path / "chk"
    result = run_local(
        sums(N, rate=10_000, checkpoint_dir=str(root), checkpoint_interval=0.05, **ROCKSDB),
    )
    assert collections.Counter(result.output("sums")) == collections.Counter(clean)
    assert stored(root), "no checkpoint holds the state as RocksDB files"
    steady = [c for c in result.checkpoints if not c.final][2:]
    assert steady
    written = sum(c.summary.state_bytes for c in steady)
    full = sum(c.summary.full_state_bytes for c in steady)
    assert 0 < written < full  # only new SST files are uploaded


@pytest.mark.parametrize(
    "fault",
    [Kill("sum[1]", after_checkpoint=5), Kill("sum[0]", during="snapshot", after_checkpoint=4)],
    ids=["kill-after-checkpoints", "kill-uploading-a-checkpoint"],
)
def test_a_kill_restores_the_rocksdb_checkpoint_exactly(
    tmp_path: Path, clean: list[Any], fault: Kill
) -> None:
    root = tmp_path / "chk"
    killed = run_local(
        sums(
            N,
            rate=10_000,
            checkpoint_dir=str(root),
            checkpoint_interval=0.05,
            retained_checkpoints=2,
            **ROCKSDB,
        ),
        faults=[fault],
    )
    assert killed.unfired_faults == []
    [restart] = killed.restarts
    assert restart.restored_checkpoint is not None
    assert collections.Counter(killed.output("sums")) == collections.Counter(clean)
    storage = CheckpointStorage(str(root))
    assert stored(root)
    for n in storage.completed_checkpoints():  # retention kept every file they refer to
        storage.check(n)


def finals(records: list[Any]) -> dict[Any, Any]:
    return dict(records)  # the last running sum of each key


def exact(want: dict[Any, Any], run: Any) -> bool:
    """Whether ``run()`` gives each key's last sum as in ``want`` (a failed run: no)."""
    try:
        got = finals(run())
    except Exception:
        return False
    return bool(got) and all(want[k] == v for k, v in got.items())


def shared_with_earlier(root: Path) -> tuple[int, set[str]]:
    """The newest RocksDB checkpoint taken midway that refers to SST files an earlier
    checkpoint uploaded (an incremental one), and those files."""
    storage = CheckpointStorage(str(root))
    seen: set[str] = set()
    found: tuple[int, set[str]] = (-1, set())
    for n in stored(root):
        files = {
            f.ref.path
            for h in storage.check(n).tasks.values()
            for store in h.stores.values()
            for f in store.files
            if f.name.endswith(".sst")
        }
        if files & seen:
            found = (n, files & seen)
        seen |= files
    return found


@pytest.fixture(scope="module")
def midway(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, set[str]]:
    """A run on rocksdb retaining every checkpoint: the root, a checkpoint taken before
    the end of the input that shares SST files with earlier ones, and those files."""
    root = tmp_path_factory.mktemp("midway") / "chk"
    first = run_local(
        sums(
            N,
            rate=20_000,
            retained_checkpoints=1000,
            checkpoint_dir=str(root),
            checkpoint_interval=0.05,
            **ROCKSDB,
        )
    )
    early = {c.checkpoint_id for c in first.checkpoints if (c.committed_records_in or N) < N * 0.9}
    storage = CheckpointStorage(str(root))
    for n in sorted(storage.completed_checkpoints(), reverse=True):
        if n not in early:  # keep only the checkpoints up to one taken midway
            storage.discard(n)
    n, shared = shared_with_earlier(root)
    assert n > 0 and shared, "no checkpoint refers to SST files an earlier one uploaded"
    return root, n, shared


@pytest.mark.parametrize("parallelism", [1, 3], ids=["2-to-1", "2-to-3"])
def test_rescaling_from_a_rocksdb_checkpoint_keeps_every_key(
    tmp_path: Path, clean: list[Any], midway: tuple[Path, int, set[str]], parallelism: int
) -> None:
    """The resumed run's last sum of each key equals the failure-free run's."""
    root, n, _ = midway
    flow = sums(
        N,
        parallelism=parallelism,
        checkpoint_dir=str(tmp_path / "chk"),
        checkpoint_interval=0.05,
        **ROCKSDB,
    )
    assert exact(
        finals(clean), lambda: run_local(flow, restore_from=str(root / f"chk-{n}")).output("sums")
    )


def test_companion_a_shared_file_deleted_too_early_is_detected(
    tmp_path: Path, clean: list[Any], midway: tuple[Path, int, set[str]]
) -> None:
    """What the shared state registry prevents: the SST files a checkpoint shares with
    earlier ones deleted. Verification names the missing file, and a restore of that
    checkpoint (same parallelism, 2 -> 3) is not exact."""
    root, n, shared = midway
    copy = tmp_path / "copy"
    import shutil

    shutil.copytree(root, copy)
    for path in shared:
        os.remove(copy / path)
    with pytest.raises(Exception, match="missing"):
        CheckpointStorage(str(copy)).check(n)
    for parallelism in (2, 3):
        flow = sums(
            N, parallelism=parallelism, checkpoint_dir=str(tmp_path / f"p{parallelism}"), **ROCKSDB
        )
        restore = str(copy / f"chk-{n}")
        assert not exact(
            finals(clean), lambda f=flow, r=restore: run_local(f, restore_from=r).output("sums")
        )


def stop_with_savepoint(flow: Dataflow, root: Path) -> tuple[list[Any], str]:
    """Run ``flow`` until a checkpoint completed, stop it with a savepoint: its committed
    output and the savepoint."""
    import threading
    import time

    from jobmanager.stop import request_stop, running_jobs

    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["run"] = run_local(flow, progress=False)
        except BaseException as err:  # raised in the test thread below
            result["error"] = err

    def wait_for(condition: Any, what: str) -> None:
        deadline = time.monotonic() + 60
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.02)

    thread = threading.Thread(target=run)
    thread.start()
    storage = CheckpointStorage(str(root))
    try:
        wait_for(lambda: "error" in result or bool(storage.completed_checkpoints()), "a checkpoint")
        wait_for(lambda: [j for j in running_jobs() if j.job == flow.name], "the job's entry")
        (job,) = [j for j in running_jobs() if j.job == flow.name]
        request_stop(job)
    finally:
        thread.join(timeout=120)
    assert "error" not in result, result.get("error")
    stopped = result["run"]
    assert stopped.stopped and stopped.savepoint
    return stopped.output("sums"), str(stopped.savepoint)


@pytest.mark.parametrize(
    ("first", "then"),
    [("rocksdb", "memory"), ("memory", "rocksdb")],
    ids=["rocksdb-to-memory", "memory-to-rocksdb"],
)
def test_a_savepoint_resumes_on_the_other_backend_exactly(
    tmp_path: Path, clean: list[Any], first: str, then: str
) -> None:
    """Stop with a savepoint on one backend, resume on the other (at parallelism 3):
    the committed output of both runs is the failure-free run's, record for record."""
    root = tmp_path / "chk"
    flow = sums(
        N,
        rate=8_000,
        checkpoint_dir=str(root),
        checkpoint_interval=0.05,
        state_backend=first,
    )
    before, savepoint = stop_with_savepoint(flow, root)
    assert 0 < len(before) < N
    resumed = run_local(
        sums(N, parallelism=3, checkpoint_dir=str(tmp_path / "chk2"), state_backend=then),
        restore_from=savepoint,
    )
    got = collections.Counter(before + resumed.output("sums"))
    assert got == collections.Counter(clean)


def test_companion_a_rocksdb_checkpoint_is_not_canonical(tmp_path: Path) -> None:
    """What the canonical savepoint is for: the memory backend cannot read a RocksDB
    checkpoint (not a savepoint) and says how to switch."""
    root = tmp_path / "chk"
    run_local(
        sums(2_000, rate=2_000, checkpoint_dir=str(root), checkpoint_interval=0.05, **ROCKSDB)
    )
    n = stored(root)[0]
    with pytest.raises(Exception, match=r"restore it with state_backend=.rocksdb., or take a"):
        run_local(
            sums(2_000, checkpoint_dir=str(tmp_path / "chk2"), state_backend="memory"),
            restore_from=str(root / f"chk-{n}"),
        )


# -- timers, windows and joins on rocksdb (the event-time suite's kills, on the harness) ---
def test_timers_fire_exactly_once_on_rocksdb_across_a_kill() -> None:
    from tests.integration.test_event_time import CHK, bucket_counts, expected

    result = run_local(
        bucket_counts(**CHK, **ROCKSDB), faults=[Kill("buckets[1]", after_checkpoint=2)]
    )
    assert len(result.restarts) == 1, result.summary()
    assert result.restarts[0].restored_checkpoint is not None
    assert collections.Counter(result.output("out")) == expected()


def test_companion_timers_on_rocksdb_restored_without_event_time_lose_reports() -> None:
    from tests.integration.test_event_time import CHK, bucket_counts, expected

    result = run_local(
        bucket_counts(debug_drop_event_time=True, **CHK, **ROCKSDB),
        faults=[Kill("buckets[1]", after_checkpoint=2)],
    )
    assert len(result.restarts) == 1, result.summary()
    assert sum(collections.Counter(result.output("out")).values()) < sum(expected().values())


def test_session_windows_on_rocksdb_survive_a_kill() -> None:
    from tests.integration.test_event_time import CHK
    from tests.integration.test_examples import load_example

    sessions = load_example("sessions")
    clicks = 24_000
    reference = run_local(sessions.build(clicks, 2, 8_000, **CHK))
    killed = run_local(
        sessions.build(clicks, 2, 8_000, **CHK, **ROCKSDB),
        faults=[Kill("sessions[1]", after_checkpoint=2)],
    )
    assert len(killed.restarts) == 1, killed.summary()
    for name in ("per_session", "late"):
        assert collections.Counter(killed.output(name)) == collections.Counter(
            reference.output(name)
        ), name
    assert sessions.check(clicks, killed.output("per_session"), killed.output("late")) == []


def test_interval_join_on_rocksdb_survives_a_kill() -> None:
    from tests.integration.test_event_time import CHK
    from tests.integration.test_examples import load_example

    example = load_example("orders_payments")
    orders = 12_000
    killed = run_local(
        example.build(orders, 2, 4_000, **CHK, **ROCKSDB),
        faults=[Kill("paid[0]", after_checkpoint=2)],
    )
    assert len(killed.restarts) == 1, killed.summary()
    assert collections.Counter(killed.output("joined")) == example.expected(orders)


# -- the memory budget -----------------------------------------------------------------
def test_the_memory_backend_fails_past_its_budget_naming_the_step_and_the_fix() -> None:
    with pytest.raises(Exception) as failed:
        run_local(sums(60_000, checkpoint_interval=None, state_memory_budget_mb=0.1))
    text = str(failed.value)
    assert "'sum'" in text and "state_memory_budget_mb=0.1" in text
    assert "state_backend='rocksdb'" in text


def test_companion_within_the_budget_or_on_rocksdb_the_same_job_completes(
    clean: list[Any],
) -> None:
    """The same state under a budget it fits, and on rocksdb under the tiny budget."""
    roomy = run_local(sums(N, state_memory_budget_mb=64))
    assert collections.Counter(roomy.output("sums")) == collections.Counter(clean)
    rocks = run_local(sums(N, state_backend="rocksdb", state_memory_budget_mb=0.1))
    assert collections.Counter(rocks.output("sums")) == collections.Counter(clean)


def test_a_kill_restores_rocksdb_files_uploaded_to_s3(
    s3: FakeS3, s3_root: str, clean: list[Any]
) -> None:
    """The same on S3 (moto's server on loopback): SST files uploaded once through fsspec,
    downloaded by the restore."""
    killed = run_local(
        sums(
            N,
            rate=4_000,  # ~10 s: a task's first checkpoint also builds its S3 client
            checkpoint_dir=s3_root,
            checkpoint_interval=0.5,  # each uploads the new SST files of both tasks
            storage_options=s3.options,
            retained_checkpoints=100,
            **ROCKSDB,
        ),
        # after the first: on a loaded machine the S3 uploads may let the job end first
        faults=[Kill("sum[1]", after_checkpoint=1)],
    )
    [restart] = killed.restarts
    assert restart.restored_checkpoint is not None
    assert collections.Counter(killed.output("sums")) == collections.Counter(clean)
    storage = CheckpointStorage(s3_root, storage_options=s3.options)
    held = [n for n in storage.completed_checkpoints() if storage.check(n).tasks["sum[1]"].stores]
    assert restart.restored_checkpoint in held  # the restore read RocksDB files from S3
