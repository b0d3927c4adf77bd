"""What a checkpoint records about itself: one typed schema, one encode/decode pair each.

* `OperatorLayout` — where one operator's state in a task state file came from
  (subtask, parallelism, key-group range).
* `TaskStateHandle` — one task's state file (name, size, crc32, operators), or the
  same bytes held inline when they are small (Flink's memory threshold); a task sends
  it in its ``Ack`` (`encode`/`decode` to a plain dict for the control plane) and
  ``_metadata`` lists one per task.
* `StepState` — a step whose state the checkpoint holds (name, kind, parallelism,
  keyed): what a restore checks the new job against.
* `RescueRecord` — what a rescue snapshot holds (optimistic recovery of an iteration):
  the surviving loop heads' subtasks and key groups, the superstep each one's state is
  after, and the subtasks lost.
* `CheckpointMetadata` — the ``_metadata`` file: readable JSON with a ``"crc32"`` of
  its canonical body (``json.dumps(body, sort_keys=True, separators=(",", ":"))`` of
  every other key), written by the coordinator, read by restore and the CLI.

Decoding raises CorruptCheckpointError naming what is missing or malformed.
"""

from __future__ import annotations

import base64
import binascii
import json
import reprlib
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from statebackend.errors import CorruptCheckpointError
from statebackend.incremental import StateRef, StoreCheckpoint
from statebackend.metrics import AckMetrics, CheckpointSummary, decode

_LIST_HINT = "list the checkpoints with `python -m jobmanager checkpoints DIR`"


def _canonical(body: Mapping[str, object]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class OperatorLayout:
    """One operator's part of a task state file: written by ``subtask`` of ``parallelism``;
    ``key_groups`` is the ``(start, stop)`` range it owned, None if it is not keyed."""

    subtask: int
    parallelism: int
    key_groups: tuple[int, int] | None = None

    def encode(self) -> dict[str, object]:
        out: dict[str, object] = {"subtask": self.subtask, "parallelism": self.parallelism}
        if self.key_groups is not None:
            out["key_groups"] = list(self.key_groups)
        return out

    @classmethod
    def decode(cls, data: Any) -> OperatorLayout:
        try:
            groups = data.get("key_groups")
            return cls(
                int(data["subtask"]),
                int(data["parallelism"]),
                None if groups is None else (int(groups[0]), int(groups[1])),
            )
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
            raise CorruptCheckpointError(
                f"operator layout {data!r} is malformed ({err!r}): expected "
                f"{{'subtask': int, 'parallelism': int, 'key_groups': [start, stop]?}}"
            ) from err

    def overlaps(self, key_groups: range) -> bool:
        """Whether this operator's key groups overlap ``key_groups`` (False if not keyed)."""
        if self.key_groups is None:
            return False
        start, stop = self.key_groups
        return start < key_groups.stop and key_groups.start < stop


@dataclass(frozen=True, slots=True)
class TaskStateHandle:
    """One task's state in a checkpoint: the state file ``file`` (a name inside the
    checkpoint), its ``size`` and whole-file ``crc32``, and the layout of each operator
    in it. A small state is not written as a file: its bytes (the same format) travel
    ``inline`` in the task's ack and in ``_metadata``, and ``file`` is empty. ``chains``:
    the keyed state of operators checkpointed incrementally, by operator, as the files
    to apply in order (``statebackend.incremental``); their keyed state is not in
    ``file``. ``stores``: the keyed state of operators on the RocksDB backend, by
    operator, as the files of the store's checkpoint (``statebackend.rocksdb``).
    ``file`` is empty too when the task has nothing else to write."""

    file: str
    size: int
    crc32: int
    operators: Mapping[str, OperatorLayout] = field(default_factory=dict)
    inline: bytes | None = None
    chains: Mapping[str, tuple[StateRef, ...]] = field(default_factory=dict)
    stores: Mapping[str, StoreCheckpoint] = field(default_factory=dict)

    @property
    def full_size(self) -> int:
        """Bytes of the whole state: the file (or inline state) and every chain file."""
        chains = sum(ref.size for chain in self.chains.values() for ref in chain)
        return self.size + chains + sum(store.size for store in self.stores.values())

    def shared_files(self) -> set[str]:
        """The chain files under this checkpoint's root (relative paths)."""
        files = {r.path for chain in self.chains.values() for r in chain if not r.foreign}
        files.update(
            f.ref.path for store in self.stores.values() for f in store.files if not f.ref.foreign
        )
        return files

    def encode(self) -> dict[str, object]:
        out: dict[str, object] = {
            "file": self.file,
            "size": self.size,
            "crc32": self.crc32,
            "operators": {name: layout.encode() for name, layout in self.operators.items()},
        }
        if self.inline is not None:  # base64: the same dict goes into the JSON _metadata
            out["inline"] = base64.b64encode(self.inline).decode("ascii")
        if self.chains:
            out["chains"] = {
                name: [ref.encode() for ref in chain] for name, chain in self.chains.items()
            }
        if self.stores:
            out["stores"] = {name: store.encode() for name, store in self.stores.items()}
        return out

    @classmethod
    def decode(cls, data: Any) -> TaskStateHandle:
        try:
            operators = data.get("operators") or {}
            inline = data.get("inline")
            chains = data.get("chains") or {}
            stores = data.get("stores") or {}
            return cls(
                str(data["file"]),
                int(data["size"]),
                int(data["crc32"]),
                {str(name): OperatorLayout.decode(op) for name, op in operators.items()},
                None if inline is None else base64.b64decode(inline, validate=True),
                {
                    str(name): tuple(StateRef.decode(ref) for ref in chain)
                    for name, chain in chains.items()
                },
                {str(name): StoreCheckpoint.decode(store) for name, store in stores.items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError, binascii.Error) as err:
            raise CorruptCheckpointError(
                f"task state handle {reprlib.repr(data)} is malformed ({err!r}): expected "
                f"{{'file': str, 'size': int, 'crc32': int, 'operators': {{...}}, "
                f"'inline': base64?}}"
            ) from err

    def describe(self) -> str:
        """Where the state is: the file name, or "inline" (held in ``_metadata``)."""
        return "inline" if self.inline is not None else self.file


@dataclass(frozen=True, slots=True)
class StepState:
    """A step as far as its state goes: ``kind`` is the step kind's value (``"aggregate"``,
    ``"source"``, ...; empty when a checkpoint written before kinds were recorded is
    read); ``keyed`` steps can be restored at any parallelism up to max_parallelism.
    ``signature`` is set when the step's name was made up by absflow: its position in
    the graph (``runtime.step_ids``), which a restore checks; "" for a name the user gave.
    ``redistribute``: the step's non-keyed state is *union* state (Flink's union list
    state): at another parallelism every new subtask gets every old subtask's state and
    redistributes it itself (the file source's splits, a transactional sink's pending
    transactions; see ``statebackend.restore.RescaledState``)."""

    name: str
    kind: str
    parallelism: int
    keyed: bool
    signature: str = ""
    redistribute: bool = False

    @property
    def auto(self) -> bool:
        return bool(self.signature)

    def encode(self) -> dict[str, object]:
        body: dict[str, object] = {
            "name": self.name,
            "kind": self.kind,
            "parallelism": self.parallelism,
            "keyed": self.keyed,
        }
        if self.signature:
            body["signature"] = self.signature
        if self.redistribute:
            body["redistribute"] = True
        return body

    @classmethod
    def decode(cls, data: Any) -> StepState:
        try:
            return cls(
                str(data["name"]),
                str(data["kind"]),
                int(data["parallelism"]),
                bool(data["keyed"]),
                str(data.get("signature", "")),
                bool(data.get("redistribute", False)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise CorruptCheckpointError(f"step entry {data!r} is malformed ({err!r})") from err

    def describe(self) -> str:
        what = f"{self.kind} " if self.kind else ""
        keyed = "keyed" if self.keyed else "non-keyed"
        return f"{what}step '{self.name}' ({keyed}, parallelism {self.parallelism})"


@dataclass(frozen=True, slots=True)
class RescueRecord:
    """A **rescue snapshot** (an iteration's optimistic recovery, ``jobmanager.optimistic``):
    a partial checkpoint of the loop heads of superstep step ``step`` that survived a
    failed attempt, taken before they were ended. It holds the keyed state of
    ``subtasks`` (key groups ``key_groups``, as ``(start, stop)`` ranges), each after the
    superstep in ``supersteps`` (by subtask; all equal, else no rescue is written); the
    key groups of ``lost`` are not in it: the next attempt rebuilds them with the user's
    compensation function. ``failed_during``: the superstep the failed attempt was in."""

    step: str
    subtasks: tuple[int, ...]
    key_groups: tuple[tuple[int, int], ...]
    supersteps: Mapping[int, int]
    lost: tuple[int, ...]
    failed_during: int

    def encode(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "subtasks": list(self.subtasks),
            "key_groups": [list(r) for r in self.key_groups],
            "supersteps": {str(s): k for s, k in sorted(self.supersteps.items())},
            "lost": list(self.lost),
            "failed_during": self.failed_during,
        }

    @classmethod
    def decode(cls, data: Any) -> RescueRecord:
        try:
            return cls(
                str(data["step"]),
                tuple(int(s) for s in data["subtasks"]),
                tuple((int(a), int(b)) for a, b in data["key_groups"]),
                {int(s): int(k) for s, k in data["supersteps"].items()},
                tuple(int(s) for s in data["lost"]),
                int(data["failed_during"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise CorruptCheckpointError(
                f"rescue record {reprlib.repr(data)} is malformed ({err!r}): expected "
                "{'step': str, 'subtasks': [int], 'key_groups': [[start, stop]], "
                "'supersteps': {subtask: int}, 'lost': [int], 'failed_during': int}"
            ) from err

    def describe(self) -> str:
        return (
            f"rescue of '{self.step}' subtasks {list(self.subtasks)} (lost {list(self.lost)}, "
            f"failed during superstep {self.failed_during})"
        )


def steps_of(tasks: Mapping[str, TaskStateHandle]) -> tuple[StepState, ...]:
    """The steps the state files hold, from their layouts (kinds unknown), by name."""
    found: dict[str, StepState] = {}
    for handle in tasks.values():
        for name, layout in handle.operators.items():
            found.setdefault(
                name, StepState(name, "", layout.parallelism, layout.key_groups is not None)
            )
    return tuple(found[name] for name in sorted(found))


@dataclass(frozen=True, slots=True)
class CheckpointMetadata:
    """The ``_metadata`` of a completed checkpoint (see the module docstring)."""

    checkpoint_id: int
    job: str
    attempt: int
    final: bool
    trigger_time: float
    """Wall clock (time.time()) when the coordinator triggered the checkpoint."""
    completed_time: float
    duration_ms: float
    max_parallelism: int
    tasks: Mapping[str, TaskStateHandle]
    """By task id; tasks without state (no storage, nothing to write) are absent."""
    task_metrics: Mapping[str, AckMetrics]
    """By task id: the metrics of its ack (start_delay_ms, alignment_ms, sync_ms, ...)."""
    metrics: CheckpointSummary
    """Checkpoint-level summary (statebackend.metrics.summarize)."""
    steps: tuple[StepState, ...] = ()
    """The steps whose state the checkpoint holds, by name."""
    savepoint: bool = False
    """Taken by a stop with savepoint: retention never deletes it."""
    superstep: int | None = None
    """An iteration's checkpoint: taken at the boundary after this superstep (a restore
    goes on with the next one); None for other checkpoints."""
    rescue: RescueRecord | None = None
    """A rescue snapshot (partial: the surviving loop heads only), see `RescueRecord`."""

    def step(self, name: str) -> StepState | None:
        return next((s for s in self.steps if s.name == name), None)

    def _body(self) -> dict[str, object]:
        """What ``_metadata`` holds besides its crc. Every key is a str and every value
        a JSON type (tuples as lists aside): dumped, it is already canonical, and a reader
        that loads and dumps it again gets the same bytes, so the crc of one dump covers
        exactly what the reader checks (no round trip through JSON here: it was the larger
        half of the coordinator's cost of a checkpoint's metadata)."""
        return {
            "checkpoint_id": self.checkpoint_id,
            "job": self.job,
            "attempt": self.attempt,
            "final": self.final,
            "trigger_time": self.trigger_time,
            "completed_time": self.completed_time,
            "duration_ms": self.duration_ms,
            "max_parallelism": self.max_parallelism,
            "tasks": {task: handle.encode() for task, handle in self.tasks.items()},
            "task_metrics": {task: m.encode() for task, m in self.task_metrics.items()},
            "metrics": self.metrics.encode(),
            "steps": [s.encode() for s in self.steps],
            "savepoint": self.savepoint,
            "superstep": self.superstep,
            **({} if self.rescue is None else {"rescue": self.rescue.encode()}),
        }

    def to_json(self) -> str:
        """The canonical body (compact, keys sorted) with ``"crc32"`` of it as its last key.

        Compact because the coordinator writes one per completed checkpoint, many a second
        at short intervals, and Python indents JSON in pure Python (several times the cost
        of the whole canonical encoding). ``python -m jobmanager checkpoints DIR --show N``
        prints it as tables."""
        canonical = _canonical(self._body())
        return f'{canonical[:-1].decode()},"crc32":{zlib.crc32(canonical)}}}\n'

    @classmethod
    def from_json(cls, text: str, source: str = "_metadata") -> CheckpointMetadata:
        """Parse and verify ``_metadata`` text; ``source`` names it in errors."""
        try:
            body = json.loads(text)
        except ValueError as err:
            raise CorruptCheckpointError(
                f"checkpoint metadata {source!r} is not valid JSON ({err}); the checkpoint "
                f"cannot be restored, use an older one ({_LIST_HINT})"
            ) from err
        if not isinstance(body, dict) or not isinstance(body.get("crc32"), int):
            raise CorruptCheckpointError(
                f"checkpoint metadata {source!r} has no crc32 field; it was not written by "
                f"absflow or is damaged ({_LIST_HINT})"
            )
        recorded = body.pop("crc32")
        crc = zlib.crc32(_canonical(body))
        if crc != recorded:
            raise CorruptCheckpointError(
                f"checkpoint metadata {source!r} fails its checksum (crc32 {crc:#010x}, recorded "
                f"{recorded:#010x}); it was modified or damaged, use an older checkpoint "
                f"({_LIST_HINT})"
            )
        try:
            tasks = {str(t): _task_handle(source, str(t), h) for t, h in body["tasks"].items()}
            steps = body.get("steps")
            return cls(
                checkpoint_id=int(body["checkpoint_id"]),
                job=str(body["job"]),
                attempt=int(body["attempt"]),
                final=bool(body["final"]),
                trigger_time=float(body["trigger_time"]),
                completed_time=float(body["completed_time"]),
                duration_ms=float(body["duration_ms"]),
                max_parallelism=int(body["max_parallelism"]),
                tasks=tasks,
                task_metrics={
                    str(t): decode(AckMetrics, m) for t, m in body["task_metrics"].items()
                },
                metrics=decode(CheckpointSummary, body["metrics"]),
                steps=steps_of(tasks)
                if steps is None
                else tuple(StepState.decode(s) for s in steps),
                savepoint=bool(body.get("savepoint", False)),
                superstep=None if body.get("superstep") is None else int(body["superstep"]),
                rescue=None if body.get("rescue") is None else RescueRecord.decode(body["rescue"]),
            )
        except KeyError as err:
            raise CorruptCheckpointError(
                f"checkpoint metadata {source!r} lacks the field {err.args[0]!r}; it was not "
                f"written by this version of absflow ({_LIST_HINT})"
            ) from err
        except (TypeError, ValueError, AttributeError) as err:
            raise CorruptCheckpointError(
                f"checkpoint metadata {source!r} is malformed ({err}) ({_LIST_HINT})"
            ) from err


def _task_handle(source: str, task: str, data: Any) -> TaskStateHandle:
    try:
        return TaskStateHandle.decode(data)
    except CorruptCheckpointError as err:
        raise CorruptCheckpointError(
            f"checkpoint metadata {source!r}, task {task!r}: {err} ({_LIST_HINT})"
        ) from err
