"""Routing of record batches to the subtasks of the next step.

Keyed routing goes through key groups, as in Flink: a key hashes (stably, the
same in every process) into one of ``max_parallelism`` key groups, and each
subtask owns a contiguous range of key groups. State is snapshotted per key
group, so a job can be restored with another parallelism by reassigning ranges.

Every partitioner maps a batch to ``(target index, sub-batch)`` pairs: only
non-empty sub-batches, input order preserved inside each sub-batch. Sub-batches
may be the input list itself (forward, broadcast, single target): callers must
treat both the input and the output lists as read-only once partitioned.

Threading: a partitioner instance belongs to one task thread.
"""

from __future__ import annotations

import operator
import types
import zlib
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol, TypeVar, cast

import msgpack

from channels.errors import AbsflowError

DEFAULT_MAX_PARALLELISM: Final = 128
"""Number of key groups when the job does not set one; the upper bound on parallelism."""

HASH_CACHE_SIZE: Final = 65_536
"""Entries of a HashPartitioner's key -> bucket cache before it is cleared."""

_crc32 = zlib.crc32
# One shared Packer: constructing one per call (msgpack.packb) costs more than the
# packing. Safe to share across threads: it packs canonical values (plain builtins)
# without running Python code, so each call completes under the GIL, and it resets
# its buffer when packing raises.
_pack_key: Callable[[object], bytes] = msgpack.Packer(use_bin_type=True).pack
_BIG_INT_EXT: Final = 0


_CO_VARARGS: Final = 0x04
_CO_VARKEYWORDS: Final = 0x08


def bytecode_match(fn: object, template: Callable[..., object]) -> types.CodeType | None:
    """``fn``'s code object when ``fn`` is a plain Python function with ``template``'s
    bytecode and number of positional parameters, and no ``*args``, ``**kwargs`` or
    keyword-only ones; else None. Its body then does exactly what ``template``'s does, on
    its own constants (``co_consts``): the test behind every fast path that runs a user
    function's operation without calling it (``is_identity``, ``fast_key_fn``,
    ``runtime.operators.constant_addend``)."""
    if not isinstance(fn, types.FunctionType):
        return None
    code, model = fn.__code__, template.__code__
    if (
        code.co_code != model.co_code
        or code.co_argcount != model.co_argcount
        or code.co_kwonlyargcount
        or code.co_flags & (_CO_VARARGS | _CO_VARKEYWORDS)
    ):
        return None
    return code


def _identity(record: object) -> object:  # the templates of the fast paths below
    return record


def _subscript(
    record: Sequence[object],
) -> object:  # ``record[<constant>]``: the constant is co_consts[1]
    return record[0]


def is_identity(fn: object) -> bool:
    """Whether ``fn`` is a plain Python function that returns its one argument as is
    (``lambda w: w``, ``def key(r): return r``): keyed steps then use the record as its
    key without calling ``fn`` per record (the key of a word count is the word).

    Decided from the bytecode, so only functions that can do nothing else qualify: one
    positional parameter, no ``*args``/``**kwargs``, a body of ``return <parameter>``.
    """
    return bytecode_match(fn, _identity) is not None


def fast_key_fn(fn: Callable[..., object]) -> Callable[..., object]:
    """``fn``, or a C-level equivalent: ``operator.itemgetter(c)`` for a plain function whose
    body is ``return record[c]`` with ``c`` an int or str constant (``lambda r: r[0]``,
    ``lambda e: e["user"]``): the same ``record[c]`` with the same errors, without a
    Python frame per record. Decided from the bytecode, like ``is_identity``."""
    code = bytecode_match(fn, _subscript)
    if code is not None and type(code.co_consts[1]) in (int, str):
        getter: Callable[..., object] = operator.itemgetter(code.co_consts[1])
        return getter
    return fn


class PartitioningError(AbsflowError, ValueError):
    """A partitioner was configured with impossible parallelism values."""


class UnroutableKeyError(AbsflowError, TypeError):
    """A key function returned a value that cannot be hashed stably."""


R = TypeVar("R")  # the records a partitioner splits (never looked inside but for their key)


class Partitioner(Protocol):
    """Splits a batch into per-target sub-batches."""

    def partition(self, records: list[R]) -> list[tuple[int, list[R]]]:
        """Return ``(target, sub-batch)`` pairs, non-empty, order kept per target."""
        ...


def _canonical(value: Any) -> object:
    """Map values Python considers equal to one msgpack encoding (``value``: any key,
    dispatched on its exact type).

    ``True == 1 == 1.0`` and ``(1,) == (True,)`` in Python (so they share a dict
    entry, and keyed state), but msgpack encodes them differently. Bools and
    integral floats become ints, ints beyond 64 bits an ext type, lists tuples.
    """
    kind = type(value)
    if kind is bool:
        return int(value)
    if kind is float:
        return _canonical(int(value)) if value.is_integer() else value
    if isinstance(value, int):
        value = int(value)
        if -(2**63) <= value < 2**64:
            return value
        return msgpack.ExtType(_BIG_INT_EXT, str(value).encode())
    if kind is tuple or kind is list:
        return tuple(_canonical(item) for item in value)
    if kind is dict:
        return {_canonical(k): _canonical(v) for k, v in value.items()}
    return value


def stable_hash(key: object) -> int:
    """Hash ``key`` identically in every process and Python version.

    ``zlib.crc32`` of ``msgpack.packb(key, use_bin_type=True)``: Python's own
    ``hash()`` of str/bytes is salted per process (PYTHONHASHSEED), so it cannot
    route records between processes. Values that compare equal in Python hash
    equally: bools and integral floats hash as the equal int (``True``, ``1``,
    ``1.0``), lists as tuples, ints beyond 64 bits via their decimal digits.
    Dicts hash in insertion order; do not use dicts as keys.

    Raises:
        UnroutableKeyError: the key is not made of msgpack types.
    """
    kind = type(key)
    try:
        if kind is str or kind is bytes or kind is int:
            try:
                return _crc32(_pack_key(key))
            except OverflowError:  # beyond 64 bits: the canonical ext encoding
                pass
        return _crc32(_pack_key(_canonical(key)))
    except (TypeError, ValueError) as err:
        raise UnroutableKeyError(
            f"key {key!r} of type {type(key).__name__!r} cannot be hashed stably ({err}); "
            "key functions must return msgpack types (None, bool, int, float, str, "
            "bytes, tuple, or tuples of these)"
        ) from err


def key_group_for(key: object, max_parallelism: int) -> int:
    """Key group of ``key``: ``stable_hash(key) % max_parallelism``."""
    return stable_hash(key) % max_parallelism


def subtask_for_key_group(key_group: int, max_parallelism: int, parallelism: int) -> int:
    """Subtask owning ``key_group`` (Flink's ``keyGroup * parallelism // maxParallelism``)."""
    return key_group * parallelism // max_parallelism


def key_group_range(subtask: int, parallelism: int, max_parallelism: int) -> range:
    """The contiguous key groups ``subtask`` owns; the exact inverse of subtask_for_key_group.

    Ranges of subtasks ``0 .. parallelism-1`` are disjoint and cover
    ``range(max_parallelism)``; none is empty since parallelism <= max_parallelism.
    """
    _check_parallelism(parallelism, max_parallelism)
    if not 0 <= subtask < parallelism:
        raise PartitioningError(
            f"subtask {subtask} is outside 0..{parallelism - 1} for parallelism {parallelism}"
        )
    start = (subtask * max_parallelism + parallelism - 1) // parallelism
    stop = ((subtask + 1) * max_parallelism + parallelism - 1) // parallelism
    return range(start, stop)


def _check_parallelism(parallelism: int, max_parallelism: int) -> None:
    if max_parallelism < 1:
        raise PartitioningError(f"max_parallelism must be at least 1, got {max_parallelism}")
    if not 1 <= parallelism <= max_parallelism:
        raise PartitioningError(
            f"parallelism {parallelism} must be between 1 and max_parallelism "
            f"{max_parallelism}; raise max_parallelism (the number of key groups) or "
            "lower the parallelism"
        )


def _check_targets(num_targets: int) -> None:
    if num_targets < 1:
        raise PartitioningError(f"num_targets must be at least 1, got {num_targets}")


class ForwardPartitioner:
    """Everything to one target (the same list object, no copy)."""

    __slots__ = ("_target",)

    def __init__(self, target: int) -> None:
        self._target = target

    def partition(self, records: list[R]) -> list[tuple[int, list[R]]]:
        return [(self._target, records)] if records else []


class HashPartitioner:
    """Routes each record by the key group of ``key_fn(record)``.

    Target = ``subtask_for_key_group(key_group_for(key), max_parallelism, num_targets)``,
    so a key always reaches the subtask owning its key group. A bounded cache (cleared
    when it holds ``HASH_CACHE_SIZE`` keys) maps a seen key straight to its target's
    bucket (the bucket's ``append``), so a repeated key costs one dict lookup and one
    call; unhashable keys (lists) bypass it. The buckets live as long as the partitioner
    and are emptied into fresh lists after every batch (also when a key function
    raises: no record of a failed batch reaches the next). An identity ``key_fn``
    (``is_identity``) is not called: the record is its key; ``r[c]`` runs as
    ``operator.itemgetter`` (``fast_key_fn``).
    """

    __slots__ = (
        "_appends",
        "_buckets",
        "_cache",
        "_identity",
        "_key_fn",
        "_max_parallelism",
        "_num_targets",
        "_warm",
    )

    def __init__(
        self, key_fn: Callable[..., object], num_targets: int, max_parallelism: int
    ) -> None:
        _check_parallelism(num_targets, max_parallelism)
        self._key_fn = fast_key_fn(key_fn)
        self._identity = is_identity(key_fn)
        self._num_targets = num_targets
        self._max_parallelism = max_parallelism
        self._buckets: list[list[object]] = [[] for _ in range(num_targets)]
        self._appends: list[Callable[[object], None]] = [b.append for b in self._buckets]
        self._cache: dict[object, Callable[[object], None]] = {}
        # The last batch found every key cached: try the all-hits loop first.
        self._warm = False

    def target_for_key(self, key: object) -> int:
        """The target index of ``key`` (uncached)."""
        return stable_hash(key) % self._max_parallelism * self._num_targets // self._max_parallelism

    def partition(self, records: list[R]) -> list[tuple[int, list[R]]]:
        if not records:
            return []
        if self._num_targets == 1:
            return [(0, records)]
        buckets = self._buckets
        try:
            if not self._warm or not self._route_cached(records):
                self._route_resolving(records)
        except BaseException:
            for bucket in buckets:
                bucket.clear()
            raise
        out: list[tuple[int, list[object]]] = []
        for target, bucket in enumerate(buckets):
            if bucket:
                out.append((target, bucket[:]))
                bucket.clear()
        # the buckets hold this call's records only (emptied after every call)
        return cast("list[tuple[int, list[R]]]", out)

    def _route_cached(self, records: list[R]) -> bool:
        """Route a batch whose keys are all cached; False (buckets emptied) at the first
        new or unhashable key: the batch is then redone by `_route_resolving`."""
        route = self._cache
        try:
            if self._identity:
                for record in records:
                    route[record](record)
            else:
                key_fn = self._key_fn
                for record in records:
                    route[key_fn(record)](record)
        except (KeyError, TypeError):
            for bucket in self._buckets:
                bucket.clear()
            return False
        return True

    def _route_resolving(self, records: list[R]) -> None:
        appends = self._appends
        cache = self._cache
        get = cache.get
        key_fn = self._key_fn
        target_for_key = self.target_for_key
        all_hits = True
        for record in records:
            key = key_fn(record)
            try:
                append = get(key)
            except TypeError:  # unhashable key: route it without caching
                appends[target_for_key(key)](record)
                continue
            if append is None:
                all_hits = False
                append = appends[target_for_key(key)]
                if len(cache) >= HASH_CACHE_SIZE:
                    cache.clear()
                cache[key] = append
            append(record)
        self._warm = all_hits


class RebalancePartitioner:
    """Round robin per record, continuing across calls."""

    __slots__ = ("_next", "_num_targets")

    def __init__(self, num_targets: int, start: int = 0) -> None:
        _check_targets(num_targets)
        self._num_targets = num_targets
        self._next = start % num_targets

    def partition(self, records: list[R]) -> list[tuple[int, list[R]]]:
        n = self._num_targets
        first = self._next
        self._next = (first + len(records)) % n
        if n == 1:
            return [(0, records)] if records else []
        return [
            ((first + offset) % n, records[offset::n]) for offset in range(min(n, len(records)))
        ]


class BroadcastPartitioner:
    """The same list object to every target."""

    __slots__ = ("_targets",)

    def __init__(self, num_targets: int) -> None:
        _check_targets(num_targets)
        self._targets = range(num_targets)

    def partition(self, records: list[R]) -> list[tuple[int, list[R]]]:
        if not records:
            return []
        return [(target, records) for target in self._targets]
