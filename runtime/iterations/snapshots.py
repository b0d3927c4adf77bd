"""Superstep checkpoints of an iteration's state (seed 004 §5, pessimistic recovery).

Layout under the iteration's checkpoint root, on the same storage as streaming
checkpoints (`statebackend.fs`: a local or shared directory, or an fsspec URL such as
``s3://bucket/prefix`` opened with the job's ``storage_options``)::

    sstep-<k>/part-<i>-a<n> lz4 frame of msgpack objects: [[key, value], ...] chunks,
                            then {"workset": [...] | None}; written by attempt n
    sstep-<k>/_metadata     written by the job manager once every part of one attempt
                            is there: {"superstep", "parallelism", "attempt"}

Parts carry their attempt, so a writer left over from a failed attempt (a thread of a
reused Python worker finishing a head checkpoint) cannot replace a newer attempt's part.

A part is written through `FileSystem.open_write` (locally: temp file, fsync, rename;
on an object store: one upload that appears when it is closed), and a superstep counts
only with its ``_metadata`` (one whole-file write, last). ``PartWriter`` takes the
chunks as they are produced, on its own thread, which is what makes the three variants
differ: *blocking* writes the whole state and waits, *tail* feeds the chunks while the
update produces them, *head* writes the committed state while the next superstep runs.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any

import lz4.frame
import msgpack

from statebackend.fs import FileSystem, filesystem_for

__all__ = ["PartWriter", "SuperstepStore"]

_END = object()
METADATA = "_metadata"


class SuperstepStore:
    """The superstep checkpoints under ``root`` (a path or a storage URL, opened with
    ``storage_options``). The constructor does no I/O; any thread may use it."""

    def __init__(self, root: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.fs: FileSystem
        self.fs, self.root = filesystem_for(root, storage_options)

    def __repr__(self) -> str:
        return f"SuperstepStore({self.root!r})"

    def directory(self, superstep: int) -> str:
        return self.fs.join(self.root, f"sstep-{superstep}")

    def part_path(self, superstep: int, index: int, attempt: int) -> str:
        return self.fs.join(self.directory(superstep), f"part-{index}-a{attempt}")

    def complete(self, superstep: int, parallelism: int, attempt: int, retain: int = 2) -> None:
        """Every part of ``superstep`` by ``attempt`` is written: make it count, drop
        older ones."""
        meta = {"superstep": superstep, "parallelism": parallelism, "attempt": attempt}
        path = self.fs.join(self.directory(superstep), METADATA)
        self.fs.write_whole(path, json.dumps(meta).encode())
        done = self.completed()
        for old in done[:-retain]:
            self.fs.remove_tree(self.directory(old))

    def completed(self) -> list[int]:
        if not self.fs.is_dir(self.root):
            return []
        found = []
        for name in self.fs.list_dirs(self.root):
            if name.startswith("sstep-") and self.fs.exists(
                self.fs.join(self.root, name, METADATA)
            ):
                found.append(int(name.split("-", 1)[1]))
        return sorted(found)

    def latest(self) -> int | None:
        done = self.completed()
        return done[-1] if done else None

    def read_part(self, superstep: int, index: int) -> tuple[dict[Any, Any], set[Any] | None]:
        """Part ``index`` of ``superstep``: of the attempt its ``_metadata`` names (0
        without metadata: the job manager's own input files)."""
        meta = self.fs.join(self.directory(superstep), METADATA)
        attempt = json.loads(self.fs.read_bytes(meta))["attempt"] if self.fs.exists(meta) else 0
        solution: dict[Any, Any] = {}
        workset: set[Any] | None = None
        with (
            self.fs.open_read(self.part_path(superstep, index, attempt)) as raw,
            lz4.frame.open(raw, "rb") as f,
        ):
            unpacker = msgpack.Unpacker(f, raw=False, use_list=False, strict_map_key=False)
            for obj in unpacker:
                if isinstance(obj, dict):
                    ws = obj["workset"]
                    workset = None if ws is None else set(ws)
                else:
                    solution.update(obj)
        return solution, workset


class PartWriter:
    """Writes one part on a background thread; ``add`` chunks, then ``finish``; ``wait``
    blocks until it is durable and returns the seconds spent writing."""

    def __init__(self, store: SuperstepStore, superstep: int, index: int, attempt: int = 0) -> None:
        self.superstep = superstep
        self.fs = store.fs
        self.path = store.part_path(superstep, index, attempt)
        self._queue: queue.Queue[Any] = queue.Queue()
        self._error: BaseException | None = None
        self.seconds = 0.0
        self._thread = threading.Thread(
            target=self._run, name=f"sstep-{superstep}-writer", daemon=True
        )
        self._thread.start()

    def add(self, items: list[tuple[Any, Any]]) -> None:
        self._queue.put(items)

    def finish(self, workset: set[Any] | None) -> None:
        self._queue.put({"workset": None if workset is None else list(workset)})
        self._queue.put(_END)

    def _run(self) -> None:
        try:
            with self.fs.open_write(self.path) as raw:
                f = lz4.frame.open(raw, "wb")
                while (obj := self._queue.get()) is not _END:
                    started = time.perf_counter()
                    f.write(msgpack.packb(obj, use_bin_type=True))
                    self.seconds += time.perf_counter() - started
                started = time.perf_counter()
                f.close()  # the frame's end; open_write's exit makes it durable
            self.seconds += time.perf_counter() - started
        except BaseException as err:  # reported by wait()
            self._error = err

    def wait(self) -> float:
        self._thread.join()
        if self._error is not None:
            raise OSError(
                f"writing superstep checkpoint {self.path} failed: {self._error}"
            ) from self._error
        return self.seconds


def write_whole(
    store: SuperstepStore,
    superstep: int,
    index: int,
    solution: dict[Any, Any],
    workset: set[Any] | None,
    attempt: int = 0,
    chunk: int = 8192,
) -> PartWriter:
    writer = PartWriter(store, superstep, index, attempt)
    items = list(solution.items())
    for i in range(0, len(items), chunk):
        writer.add(items[i : i + chunk])
    writer.finish(workset)
    return writer
