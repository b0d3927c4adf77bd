"""``python -m jobmanager checkpoints DIR [--show N]`` on a real checkpoint root, local
and on S3 (moto)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from jobmanager.cli import main
from statebackend.metadata import CheckpointMetadata, OperatorLayout, StepState
from statebackend.metrics import AckMetrics, CheckpointSummary
from statebackend.snapshot import OperatorSnapshot
from statebackend.storage import CheckpointStorage
from tests.conftest import FakeS3

REPO = Path(__file__).resolve().parents[2]


def task_metrics(align: float) -> AckMetrics:
    return AckMetrics(
        start_delay_ms=0.4,
        alignment_ms=align,
        sync_ms=0.3,
        async_ms=2.5,
        state_bytes=120,
        spilled_bytes=64,
        keys=3,
    )


def write_checkpoint(
    storage: CheckpointStorage, n: int, final: bool = False, savepoint: bool = False
) -> str:
    """A checkpoint with one real state file (src[0]); returns the state file's path."""
    snap = OperatorSnapshot(msgpack.packb(n * 100), None, None)
    handle = storage.write_task_state(n, "src[0]", {"src": snap}, {"src": OperatorLayout(0, 1)})
    storage.write_metadata(
        CheckpointMetadata(
            checkpoint_id=n,
            job="wordcount",
            attempt=1,
            final=final,
            trigger_time=1_700_000_000.0 + n,
            completed_time=1_700_000_000.5 + n,
            duration_ms=12.5 * n,
            max_parallelism=128,
            tasks={"src[0]": handle},
            task_metrics={"src[0]": task_metrics(0.0), "count[0]": task_metrics(7.25)},
            metrics=CheckpointSummary(
                tasks=2,
                duration_ms=12.5 * n,
                max_start_delay_ms=0.4,
                max_alignment_ms=7.25,
                mean_alignment_ms=3.625,
                max_sync_ms=0.3,
                max_async_ms=2.5,
                state_bytes=240 + n,
                spilled_bytes=128,
                keys=6,
                mode="unaligned" if n == 3 else "exactly_once",
                channel_state_bytes=4096 if n == 3 else 0,
            ),
            steps=(StepState("src", "source", 1, False),),
            savepoint=savepoint,
        )
    )
    return storage.task_state_path(n, "src[0]")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    storage = CheckpointStorage(str(tmp_path / "chk"))
    write_checkpoint(storage, 3)
    write_checkpoint(storage, 12, final=True, savepoint=True)
    os.makedirs(storage.location(13))  # in progress: no _metadata
    return tmp_path / "chk"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_list(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["checkpoints", str(root)], capsys)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == f"checkpoints in {root}"
    header = lines[1].split()
    assert header == [
        "id",
        "status",
        "final",
        "savepoint",
        "superstep",
        "mode",
        "attempt",
        "triggered",
        "duration_ms",
        "written_bytes",
        "state_bytes",
        "tasks",
        "max_align_ms",
        "spilled_bytes",
        "backedge_bytes",
        "channel_state_bytes",
    ]
    rows = lines[3:]
    assert [r.split()[:4] for r in rows] == [
        ["3", "completed", "no", "no"],
        ["12", "completed", "yes", "yes"],
        ["13", "incomplete", "-", "-"],
    ]  # newest last: 12 is a savepoint
    assert "37.5" in rows[0] and "243" in rows[0] and "7.2" in rows[0] and "128" in rows[0]
    assert "150.0" in rows[1] and "252" in rows[1]
    assert rows[0].split()[4] == "-"  # no iteration's checkpoint
    assert rows[0].split()[5] == "unaligned" and rows[0].split()[-1] == "4096"
    assert rows[1].split()[5] == "exactly_once" and rows[1].split()[-1] == "0"
    # Aligned: every column starts at the same offset on every line.
    starts = {line.index(part) for line in lines[3:5] for part in [line.split()[1]]}
    assert len(starts) == 1
    assert len({len(line) for line in lines[1:5]}) == 1


def test_list_flags_a_corrupt_checkpoint(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with open(root / "chk-3" / "src[0].state", "r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        last = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([last[0] ^ 0xFF]))
    code, out, _ = run(["checkpoints", str(root)], capsys)
    assert code == 0
    row = next(line for line in out.splitlines() if line.split()[:1] == ["3"])
    assert row.split()[1] == "corrupt"
    assert "37.5" in row  # its metadata is still readable and shown


def test_list_empty_root(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["checkpoints", str(tmp_path)], capsys)
    assert code == 0 and "no checkpoints" in out


def test_show(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["checkpoints", str(root), "--show", "12"], capsys)
    assert code == 0 and err == ""
    assert "checkpoint 12 of job 'wordcount'" in out
    assert "attempt 1, final yes, savepoint yes, max parallelism 128" in out
    for key in (
        "duration_ms",
        "max_start_delay_ms",
        "max_alignment_ms",
        "mean_alignment_ms",
        "max_sync_ms",
        "max_async_ms",
        "state_bytes",
        "spilled_bytes",
        "keys",
    ):
        assert any(line.split()[:1] == [key] for line in out.splitlines()), key
    assert "tasks (2)" in out
    task_header = next(
        line for line in out.splitlines() if line.startswith("task ") and "alignment_ms" in line
    )
    assert task_header.split() == [
        "task",
        "start_delay_ms",
        "alignment_ms",
        "sync_ms",
        "async_ms",
        "state_bytes",
        "full_state_bytes",
        "spilled_bytes",
        "backedge_records",
        "watermark",
    ]
    count_row = next(line for line in out.splitlines() if line.startswith("count[0]"))
    assert count_row.split() == ["count[0]", "0.4", "7.2", "0.3", "2.5", "120", "0", "64", "0", "-"]
    state_row = next(
        line for line in out.splitlines() if line.startswith("src[0]") and ".state" in line
    )
    assert "src[0].state" in state_row and "src" in state_row.split()[-1]
    assert "verification: OK (1 task state matches" in out
    assert "  max_alignment_ms    7.25" in out


def test_show_corrupt_state_file(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = root / "chk-12" / "src[0].state"
    state.write_bytes(state.read_bytes()[:-3])
    code, out, _ = run(["checkpoints", str(root), "--show", "12"], capsys)
    assert code == 1
    assert "verification: CORRUPT" in out and "src[0]" in out


def test_show_corrupt_metadata(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    meta = root / "chk-3" / "_metadata"
    meta.write_text(meta.read_text().replace('"wordcount"', '"wordcoun7"'))
    code, _, err = run(["checkpoints", str(root), "--show", "3"], capsys)
    assert code == 1
    assert "CORRUPT" in err and "checksum" in err


def test_missing_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope"
    code, out, err = run(["checkpoints", str(missing)], capsys)
    assert code == 2 and out == ""
    assert "does not exist" in err and "Traceback" not in err
    assert not missing.exists()  # inspecting must not create it


def test_no_checkpoint_n(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["checkpoints", str(root), "--show", "7"], capsys)
    assert code == 2
    assert "no checkpoint 7" in err and "3, 12, 13" in err


def test_show_incomplete(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["checkpoints", str(root), "--show", "13"], capsys)
    assert code == 2 and "incomplete" in err


def test_bad_usage_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["checkpoints"])
    assert info.value.code == 2
    assert "DIR" in capsys.readouterr().err


def test_as_module(root: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ok = subprocess.run(
        [sys.executable, "-m", "jobmanager", "checkpoints", str(root)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert "completed" in ok.stdout and "incomplete" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "jobmanager", "checkpoints", str(root / "x"), "--show", "1"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )
    assert bad.returncode == 2
    assert "does not exist" in bad.stderr and "Traceback" not in bad.stderr


def cli_options(s3: FakeS3) -> list[str]:
    """The fake S3's storage options as ``--storage-option KEY=VALUE`` arguments."""
    args = []
    for key, value in s3.options.items():
        text = value if isinstance(value, str) else json.dumps(value)
        args += ["--storage-option", f"{key}={text}"]
    return args


def test_list_and_show_on_s3(s3: FakeS3, s3_root: str, capsys: pytest.CaptureFixture[str]) -> None:
    storage = CheckpointStorage(s3_root, storage_options=s3.options)
    write_checkpoint(storage, 3)
    write_checkpoint(storage, 12, final=True)
    snap = OperatorSnapshot(msgpack.packb(0), None, None)
    storage.write_task_state(13, "src[0]", {"src": snap}, {"src": OperatorLayout(0, 1)})
    code, out, err = run(["checkpoints", s3_root, *cli_options(s3)], capsys)
    assert code == 0 and err == "", err
    lines = out.splitlines()
    assert lines[0] == f"checkpoints in {s3_root}"
    assert [r.split()[:2] for r in lines[3:]] == [
        ["3", "completed"],
        ["12", "completed"],
        ["13", "incomplete"],
    ]
    code, out, _ = run(["checkpoints", s3_root, "--show", "12", *cli_options(s3)], capsys)
    assert code == 0 and f"in {s3_root}/chk-12" in out and "verification: OK" in out


def test_s3_errors_exit_2(s3: FakeS3, s3_root: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["checkpoints", s3_root, *cli_options(s3)], capsys)
    assert code == 2 and out == "" and f"{s3_root!r} does not exist" in err
    code, _, err = run(["checkpoints", "nosuch://x"], capsys)
    assert code == 2 and "does not know the nosuch:// scheme" in err
    with pytest.raises(SystemExit) as info:
        main(["checkpoints", s3_root, "--storage-option", "endpoint_url"])
    assert info.value.code == 2 and "KEY=VALUE" in capsys.readouterr().err
