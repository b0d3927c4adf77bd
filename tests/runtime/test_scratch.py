"""A task's scratch dir: created on first use in the executor's temp dir, removed on close,
and stale ones of earlier attempts (a SIGKILLed task) removed by the next attempt."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtime.scratch import ScratchClosedError, ScratchDir, remove_run


def names(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def test_created_on_first_use_and_removed_on_close(tmp_path: Path) -> None:
    scratch = ScratchDir("r1", 0, 3, parent=str(tmp_path))
    with pytest.raises(ScratchClosedError):
        _ = scratch.path  # not open
    scratch.open()
    assert names(tmp_path) == []  # nothing spilled yet: no directory
    path = scratch.path
    assert os.path.basename(path).startswith("absflow-task-r1-0-3-")
    assert os.path.dirname(path) == str(tmp_path)
    Path(path, "absflow-spill-x").write_bytes(b"x")
    scratch.close()
    scratch.close()
    assert names(tmp_path) == []


def test_default_parent_is_the_processes_temp_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    scratch = ScratchDir("r1", 0, 0)
    scratch.open()
    assert os.path.dirname(scratch.path) == str(tmp_path)
    scratch.close()


def test_the_next_attempt_removes_dirs_of_killed_tasks_of_its_run(tmp_path: Path) -> None:
    killed = ScratchDir("r1", 0, 2, parent=str(tmp_path))
    killed.open()
    left = killed.path  # the task was SIGKILLed: close() never ran
    other_run = ScratchDir("r2", 0, 2, parent=str(tmp_path))
    other_run.open()
    other = other_run.path
    same_attempt = ScratchDir("r1", 1, 0, parent=str(tmp_path))
    same_attempt.open()
    same = same_attempt.path
    ScratchDir("r1", 1, 1, parent=str(tmp_path)).open()
    assert not os.path.exists(left)
    assert os.path.exists(other) and os.path.exists(same)


def test_the_job_manager_removes_what_its_run_left_on_its_host(tmp_path: Path) -> None:
    for index in (0, 3):  # the last attempt's tasks, killed
        scratch = ScratchDir("r1", 2, index, parent=str(tmp_path))
        scratch.open()
        _ = scratch.path
    keep = ScratchDir("r2", 0, 0, parent=str(tmp_path))
    keep.open()
    kept = keep.path
    assert len(remove_run("r1", parent=str(tmp_path))) == 2
    assert names(tmp_path) == [os.path.basename(kept)]
