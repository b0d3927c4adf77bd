"""A task's scratch directory (spill files of blocked channels), on the executor's disk.

Created by ``open()`` in the executor's own temp dir (``tempfile.gettempdir()`` of the
task process, or ``parent``), named ``absflow-task-<run id>-<attempt>-<task index>-*``,
and removed by ``close()``. A task killed with SIGKILL cannot remove its own: when the
next attempt's tasks open theirs, each removes the directories of earlier attempts of
the same run left in the same place (the job manager starts an attempt only after
every process of the previous one has ended). The job manager itself never removes
executor directories: it may not see the executors' disks.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

from runtime.errors import AbsflowError

PREFIX = "absflow-task-"


class ScratchClosedError(AbsflowError, RuntimeError):
    """The scratch directory was used while it does not exist (a task bug)."""


def remove_stale(parent: str, run_id: str, attempt: int) -> list[str]:
    """Remove the scratch dirs of attempts before ``attempt`` of run ``run_id`` in
    ``parent``; returns their names."""
    pattern = re.compile(rf"{re.escape(PREFIX + run_id)}-(\d+)-\d+-.+")
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    removed = []
    for name in sorted(names):
        m = pattern.fullmatch(name)
        if m and int(m.group(1)) < attempt:
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
            removed.append(name)
    return removed


class ScratchDir:
    """One task's scratch directory; ``path`` is valid between ``open()`` and ``close()``."""

    def __init__(
        self, run_id: str, attempt: int, task_index: int, parent: str | None = None
    ) -> None:
        self.run_id, self.attempt, self.task_index = run_id, attempt, task_index
        self.parent = parent
        self._path: str | None = None

    @property
    def path(self) -> str:
        if self._path is None:
            raise ScratchClosedError(
                f"scratch dir of task {self.task_index} used before open() or after close()"
            )
        return self._path

    def open(self) -> str:
        """Create the directory (after removing stale ones of this run); returns it."""
        if self._path is None:
            parent = self.parent or tempfile.gettempdir()
            remove_stale(parent, self.run_id, self.attempt)
            self._path = tempfile.mkdtemp(
                prefix=f"{PREFIX}{self.run_id}-{self.attempt}-{self.task_index}-", dir=parent
            )
        return self._path

    def close(self) -> None:
        """Remove the directory and everything in it; idempotent."""
        if self._path is not None:
            shutil.rmtree(self._path, ignore_errors=True)
            self._path = None
