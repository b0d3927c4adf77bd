"""The checkpoint directory layout.

::

    root/
      chk-7/                 one directory per checkpoint
        count[0].state       one state file per task (statebackend.snapshot)
        count[1].state
        _metadata            JSON, written LAST (temp file + fsync + rename + dir fsync)

A checkpoint counts as completed only once its ``_metadata`` exists; a ``chk-<n>``
directory without one is in progress or was aborted. ``_metadata`` is human-readable
JSON holding the caller's metadata plus ``"crc32"``: the crc32 of the canonical body
(``json.dumps(body, sort_keys=True, separators=(",", ":"))`` of every other key).
The caller's metadata is free-form except ``"tasks"``:
``{task_id: {"file": basename, "size": int, "crc32": int, ...}}``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import zlib
from typing import Any

from statebackend._fs import unlink_quietly, write_atomically
from statebackend.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    CorruptStateError,
    StateError,
)
from statebackend.snapshot import verify_state_file

log = logging.getLogger("absflow.statebackend")

METADATA = "_metadata"
_CHK = re.compile(r"chk-(\d+)")
_LIST_HINT = "list the checkpoints with `python -m jobmanager checkpoints DIR`"


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


class CheckpointStorage:
    """Checkpoints of one job under ``root`` (a local or shared-filesystem directory).

    Writers: each task writes its own state file; the coordinator writes
    ``_metadata`` after every task acknowledged, and alone calls ``retain``/``discard``.
    """

    def __init__(self, root: str) -> None:
        if root.startswith("file://"):
            root = root[len("file://") :]
        self.root: str = os.path.abspath(root)
        os.makedirs(self.root, exist_ok=True)

    def __repr__(self) -> str:
        return f"CheckpointStorage({self.root!r})"

    def _dir(self, checkpoint_id: int) -> str:
        return os.path.join(self.root, f"chk-{checkpoint_id}")

    def checkpoint_dir(self, checkpoint_id: int) -> str:
        """``root/chk-<n>``, created if missing."""
        path = self._dir(checkpoint_id)
        os.makedirs(path, exist_ok=True)
        return path

    def task_state_path(self, checkpoint_id: int, task_id: str) -> str:
        """``root/chk-<n>/<task_id>.state`` (the directory is created)."""
        if not task_id or "/" in task_id or os.sep in task_id or task_id in (".", ".."):
            raise StateError(f"task id {task_id!r} cannot be used as a file name")
        return os.path.join(self.checkpoint_dir(checkpoint_id), f"{task_id}.state")

    def write_metadata(self, checkpoint_id: int, metadata: dict[str, Any]) -> str:
        """Write ``chk-<n>/_metadata`` atomically; this completes the checkpoint.

        Adds ``"checkpoint_id"`` if missing and ``"crc32"``; returns the path.
        """
        if "crc32" in metadata:
            raise StateError(f"checkpoint {checkpoint_id}: metadata key 'crc32' is reserved")
        body = dict(metadata)
        body.setdefault("checkpoint_id", checkpoint_id)
        # Through JSON once so the crc is computed over exactly what a reader gets back
        # (tuples become lists, int dict keys become strings).
        body = json.loads(json.dumps(body))
        crc = zlib.crc32(_canonical(body))
        text = json.dumps({**body, "crc32": crc}, indent=2, sort_keys=True) + "\n"
        directory = self.checkpoint_dir(checkpoint_id)
        path = os.path.join(directory, METADATA)
        write_atomically(path, [text.encode("utf-8")])
        return path

    def read_metadata(self, checkpoint_id: int) -> dict[str, Any]:
        """The verified metadata of checkpoint ``checkpoint_id`` (without ``"crc32"``)."""
        directory = self._dir(checkpoint_id)
        path = os.path.join(directory, METADATA)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            raise CheckpointNotFoundError(
                f"checkpoint {checkpoint_id} is not completed: {path!r} does not exist "
                f"({_describe_dir(directory)}); {_LIST_HINT}"
            ) from None
        try:
            body = json.loads(text)
        except ValueError as err:
            raise CorruptCheckpointError(
                f"checkpoint metadata {path!r} is not valid JSON ({err}); the checkpoint "
                f"cannot be restored, use an older one ({_LIST_HINT})"
            ) from err
        if not isinstance(body, dict) or not isinstance(body.get("crc32"), int):
            raise CorruptCheckpointError(
                f"checkpoint metadata {path!r} has no crc32 field; it was not written by "
                f"absflow or is damaged ({_LIST_HINT})"
            )
        recorded = body.pop("crc32")
        crc = zlib.crc32(_canonical(body))
        if crc != recorded:
            raise CorruptCheckpointError(
                f"checkpoint metadata {path!r} fails its checksum (crc32 {crc:#010x}, recorded "
                f"{recorded:#010x}); it was modified or damaged, use an older checkpoint "
                f"({_LIST_HINT})"
            )
        if body.get("checkpoint_id", checkpoint_id) != checkpoint_id:
            raise CorruptCheckpointError(
                f"checkpoint metadata {path!r} belongs to checkpoint {body['checkpoint_id']}, "
                f"not {checkpoint_id}; the directory was renamed or copied"
            )
        return body

    def _all_ids(self) -> list[int]:
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        ids = []
        for name in names:
            m = _CHK.fullmatch(name)
            if m and os.path.isdir(os.path.join(self.root, name)):
                ids.append(int(m.group(1)))
        return sorted(ids)

    def completed_checkpoints(self) -> list[int]:
        """Ids of checkpoints with a ``_metadata`` file, ascending (not verified)."""
        return [i for i in self._all_ids() if os.path.isfile(os.path.join(self._dir(i), METADATA))]

    def check(self, checkpoint_id: int, verify_files: bool = True) -> dict[str, Any]:
        """Verified metadata of a checkpoint whose state files all exist with the
        recorded size (and, if ``verify_files``, crc32 and section checksums).

        Raises CheckpointNotFoundError or CorruptCheckpointError saying what failed.
        """
        metadata = self.read_metadata(checkpoint_id)
        directory = self._dir(checkpoint_id)
        tasks = metadata.get("tasks", {})
        if not isinstance(tasks, dict):
            raise CorruptCheckpointError(
                f"checkpoint {checkpoint_id}: metadata 'tasks' is {type(tasks).__name__}, "
                f"expected an object"
            )
        for task_id, info in sorted(tasks.items()):
            try:
                path = os.path.join(directory, info["file"])
                size, crc = info["size"], info["crc32"]
            except (KeyError, TypeError) as err:
                raise CorruptCheckpointError(
                    f"checkpoint {checkpoint_id}: metadata of task {task_id!r} lacks "
                    f"file/size/crc32 ({err!r})"
                ) from err
            try:
                actual = os.path.getsize(path)
            except OSError:
                raise CorruptCheckpointError(
                    f"checkpoint {checkpoint_id}: state file {path!r} of task {task_id!r} "
                    f"is missing"
                ) from None
            if actual != size:
                raise CorruptCheckpointError(
                    f"checkpoint {checkpoint_id}: state file {path!r} of task {task_id!r} "
                    f"has {actual} bytes, metadata records {size}"
                )
            if verify_files:
                try:
                    verify_state_file(path, crc)
                except CorruptStateError as err:
                    raise CorruptCheckpointError(
                        f"checkpoint {checkpoint_id}: task {task_id!r}: {err.what} in {path!r}"
                    ) from err
        return metadata

    def latest_valid(self, verify_files: bool = True) -> tuple[int, dict[str, Any]] | None:
        """The newest checkpoint that passes :meth:`check`, with its metadata.

        Newer checkpoints that fail (no ``_metadata``, bad checksum, missing or corrupt
        state file) are skipped with a WARNING on ``absflow.statebackend`` naming the
        checkpoint and why. None if no checkpoint is valid.
        """
        for checkpoint_id in reversed(self._all_ids()):
            try:
                return checkpoint_id, self.check(checkpoint_id, verify_files)
            except CheckpointNotFoundError:
                log.warning(
                    "skipping checkpoint %d in %s: no %s (incomplete or aborted)",
                    checkpoint_id,
                    self.root,
                    METADATA,
                )
            except CorruptCheckpointError as err:
                log.warning("skipping checkpoint %d in %s: %s", checkpoint_id, self.root, err)
        return None

    def discard(self, checkpoint_id: int) -> None:
        """Delete ``chk-<n>`` (missing is fine). ``_metadata`` goes first, so a crash
        half-way leaves an incomplete checkpoint, never a completed one missing files."""
        directory = self._dir(checkpoint_id)
        unlink_quietly(os.path.join(directory, METADATA))
        shutil.rmtree(directory, ignore_errors=True)

    def retain(self, keep: int) -> list[int]:
        """Keep the newest ``keep`` completed checkpoints; delete older completed ones
        and incomplete ``chk-*`` directories older than the newest completed one (the
        newer incomplete ones may be in progress). Returns the deleted ids, ascending."""
        if keep < 1:
            raise ValueError(f"retain(keep={keep}): keep at least 1 completed checkpoint")
        completed = self.completed_checkpoints()
        if not completed:
            return []
        kept = set(completed[-keep:])
        newest = completed[-1]
        deleted = [i for i in self._all_ids() if i < newest and i not in kept]
        for checkpoint_id in deleted:
            self.discard(checkpoint_id)
        return deleted

    @staticmethod
    def resolve(path: str) -> tuple[CheckpointStorage, int]:
        """Resolve ``run(restore_from=PATH)``.

        PATH may be a ``chk-<n>`` directory (or its ``_metadata`` file): that checkpoint,
        which must be complete and intact; or a checkpoint root: its latest valid
        checkpoint. Raises CheckpointNotFoundError / CorruptCheckpointError.
        """
        if path.startswith("file://"):
            path = path[len("file://") :]
        path = os.path.abspath(path)
        if os.path.basename(path) == METADATA and os.path.isfile(path):
            path = os.path.dirname(path)
        if not os.path.isdir(path):
            what = "is not a directory" if os.path.exists(path) else "does not exist"
            raise CheckpointNotFoundError(
                f"cannot restore from {path!r}: it {what}; pass a checkpoint root or a "
                f"chk-<n> directory in it ({_LIST_HINT})"
            )
        m = _CHK.fullmatch(os.path.basename(path))
        if m:
            storage = CheckpointStorage(os.path.dirname(path))
            checkpoint_id = int(m.group(1))
            storage.check(checkpoint_id)
            return storage, checkpoint_id
        storage = CheckpointStorage(path)
        found = storage.latest_valid()
        if found is None:
            raise CheckpointNotFoundError(
                f"cannot restore from {path!r}: no valid checkpoint in it "
                f"({_describe_dir(path)}); pass a root holding chk-<n>/_metadata "
                f"({_LIST_HINT})"
            )
        return storage, found[0]


def _describe_dir(directory: str) -> str:
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return "the directory does not exist"
    except NotADirectoryError:
        return "it is a file, not a directory"
    if not names:
        return "the directory is empty"
    shown = ", ".join(names[:8]) + (f", … ({len(names)} entries)" if len(names) > 8 else "")
    return f"it holds: {shown}"
