"""A task's scratch directory (spill files of blocked channels), on the executor's disk.

Created on first use (the first channel that spills; most tasks never need one) in the
executor's own temp dir (``tempfile.gettempdir()`` of the task process, or ``parent``),
named ``absflow-task-<run id>-<attempt>-<task index>-*``, and removed by ``close()``.
A task killed with SIGKILL cannot remove its own:

* when the next attempt's tasks open, each removes the directories of earlier
  attempts of the same run in the same place (the job manager starts an attempt only
  after every process of the previous one has ended): this works on any host;
* at the end of a run the job manager removes the run's directories left in its own
  temp dir (`remove_run`): the tasks that ran on the driver's host, e.g. killed in the
  last attempt. Directories on other hosts are left to the executors' temp cleanup.
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


def remove_stale(parent: str, run_id: str, attempt: int | None = None) -> list[str]:
    """Remove the scratch dirs of run ``run_id`` in ``parent`` of attempts before
    ``attempt`` (all attempts if None); returns their names."""
    pattern = re.compile(rf"{re.escape(PREFIX + run_id)}-(\d+)-\d+-.+")
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    removed = []
    for name in sorted(names):
        m = pattern.fullmatch(name)
        if m and (attempt is None or int(m.group(1)) < attempt):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
            removed.append(name)
    return removed


def remove_run(run_id: str, parent: str | None = None) -> list[str]:
    """Remove every scratch dir of run ``run_id`` left in ``parent`` (default: this
    process's temp dir). For the job manager, after the run's last attempt ended."""
    return remove_stale(parent or tempfile.gettempdir(), run_id)


class ScratchDir:
    """One task's scratch directory; ``path`` is valid between ``open()`` and ``close()``."""

    def __init__(
        self, run_id: str, attempt: int, task_index: int, parent: str | None = None
    ) -> None:
        self.run_id, self.attempt, self.task_index = run_id, attempt, task_index
        self.parent = parent
        self._path: str | None = None
        self._opened = False

    @property
    def path(self) -> str:
        """The directory, created on first use (after ``open()``)."""
        if not self._opened:
            raise ScratchClosedError(
                f"scratch dir of task {self.task_index} used before open() or after close()"
            )
        if self._path is None:
            self._path = tempfile.mkdtemp(
                prefix=f"{PREFIX}{self.run_id}-{self.attempt}-{self.task_index}-",
                dir=self._parent(),
            )
        return self._path

    def _parent(self) -> str:
        return self.parent or tempfile.gettempdir()

    def open(self) -> None:
        """Remove what earlier attempts of this run left; the directory comes on first use."""
        remove_stale(self._parent(), self.run_id, self.attempt)
        self._opened = True

    def close(self) -> None:
        """Remove the directory and everything in it; idempotent."""
        self._opened = False
        if self._path is not None:
            shutil.rmtree(self._path, ignore_errors=True)
            self._path = None
