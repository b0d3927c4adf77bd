"""The root of absflow's errors, shared by every package.

It lives in the lowest layer (``channels`` imports nothing of ours) so that
``statebackend``, ``runtime`` and ``jobmanager`` can all derive from it without
import cycles. Users import it as ``runtime.AbsflowError``.
Also here: `RecordSerializationError`, raised by the channels and named by the task.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterable
from typing import Any


class AbsflowError(Exception):
    """Root of every error absflow raises on purpose.

    Messages say what is wrong, the value involved, and how to fix it.
    """


_WIRE_TYPES = "None, bool, int, float, str, bytes, tuples/lists, dicts"
_FINE = object()


def _offending(value: Any) -> Any:
    """The first part of ``value`` (depth first; ``value`` itself included) that msgpack
    cannot pack, or ``_FINE``."""
    if isinstance(value, str):  # only UTF-8 goes on the wire: a lone surrogate does not
        try:
            value.encode()
        except UnicodeEncodeError:
            return value
        return _FINE
    if value is None or isinstance(value, bool | float | bytes | bytearray | memoryview):
        return _FINE
    if isinstance(value, int):
        return _FINE if -(2**63) <= value < 2**64 else value
    if isinstance(value, list | tuple):
        parts: Iterable[Any] = value
    elif isinstance(value, dict):
        parts = (x for kv in value.items() for x in kv)
    else:
        return value
    for part in parts:
        found = _offending(part)
        if found is not _FINE:
            return found
    return _FINE


def _fix(leaf: Any) -> str:
    if isinstance(leaf, str):
        return (
            "strings must be valid Unicode: drop or replace the lone surrogates (e.g. "
            "s.encode('utf-8', 'replace').decode()), or send the raw bytes "
            "(s.encode('utf-8', 'surrogateescape'))"
        )
    if isinstance(leaf, set | frozenset):
        return f"convert the {type(leaf).__name__} to a list/tuple"
    if isinstance(leaf, int):
        return "keep ints within 64 bits (send bigger ones as str)"
    return f"convert the {type(leaf).__name__} to one of these (e.g. an object to a dict or tuple)"


class RecordSerializationError(AbsflowError, TypeError):
    """A record that must cross tasks (a channel, or a collect() sink's trip to the driver)
    cannot be encoded as msgpack. Fatal for the job: a restart meets the same record.

    ``step`` is the step that produced the record (None where it is not known: the
    channel layer; the task names it), ``record`` the record, ``index`` its position in
    its batch, ``offending_type`` the name of the type msgpack rejected.
    """

    def __init__(
        self,
        message: str,
        *,
        step: str | None = None,
        record: Any = None,
        index: int = -1,
        offending_type: str = "",
        cause: str = "",
    ) -> None:
        super().__init__(message)
        self.step = step
        self.record = record
        self.index = index
        self.offending_type = offending_type
        self.cause = cause

    @classmethod
    def of_batch(
        cls, records: Iterable[Any], err: BaseException, step: str | None = None
    ) -> RecordSerializationError:
        """The error for a batch that did not pack: names its first bad record."""
        for index, record in enumerate(records):
            leaf = _offending(record)
            if leaf is not _FINE:
                return cls._build(step, record, index, leaf, str(err))
        return cls(
            f"a batch cannot be encoded ({err}): records crossing tasks must be msgpack "
            f"types (None, bool, int, float, str, bytes, list/tuple, dict)",
            step=step,
            cause=str(err),
        )

    @classmethod
    def _build(
        cls, step: str | None, record: Any, index: int, leaf: Any, cause: str
    ) -> RecordSerializationError:
        leaf_type = type(leaf).__name__
        outer = type(record).__name__
        holding = "" if leaf is record else f" holding a {leaf_type!r}"
        shown = reprlib.repr(record)
        if step is None:
            message = (
                f"record {index} of the batch has type {outer!r}{holding} ({cause}): {shown}; "
                f"records crossing tasks must be msgpack types (None, bool, int, float, str, "
                f"bytes, list/tuple, dict; ints within 64 bits): {_fix(leaf)}, in the "
                f"operator that emits it"
            )
        else:
            message = (
                f"step '{step}' emitted a record that cannot cross tasks: a {outer!r}"
                f"{holding}: {shown} ({cause}); records that cross tasks must be "
                f"{_WIRE_TYPES}: {_fix(leaf)} in step '{step}'"
            )
        return cls(
            message, step=step, record=record, index=index, offending_type=leaf_type, cause=cause
        )

    def naming(self, step: str) -> RecordSerializationError:
        """The same error, blaming ``step`` (the step that produced the record)."""
        if self.offending_type:
            leaf = _offending(self.record)
            return self._build(step, self.record, self.index, leaf, self.cause)
        return RecordSerializationError(
            f"step '{step}' emitted a batch that cannot cross tasks: {self}",
            step=step,
            cause=self.cause,
        )
