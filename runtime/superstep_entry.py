"""The entry of an iteration (``runtime.superstep``): its input streams, tagged.

An iteration's initial solution set, side input and workset are ordinary streams (any
source, any operators before). Each is mapped by an `EntryTag` into the loop head's one
record shape, ``(key, tag, payload)``, and hashed by key into the loop head, where
`SuperstepOperator` loads them into keyed state. The tag map is where a record of the
wrong shape is caught: it names the iteration, the input and the record (a GraphError at
run time fails the job without restarts: a restart would replay the same record).
Task side; per-record path (a check of a tuple's length per record, nothing more).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.errors import IterationError

__all__ = ["EntryTag"]


@dataclass(frozen=True)
class EntryTag:
    """Maps one record of iteration ``iteration``'s input ``what`` to ``(key, tag,
    payload)`` records.

    ``pair``: the records are ``(key, value)`` pairs (a tuple or list of two: solution
    and side input), else keys (a workset). ``also_workset``: a delta iteration without
    a workset stream starts with every solution key in its workset (one more record)."""

    iteration: str
    what: str
    tag: int
    pair: bool = True
    also_workset: int | None = None

    def __call__(self, record: Any) -> list[tuple[Any, int, Any]]:
        if not self.pair:
            return [(record, self.tag, None)]
        if not isinstance(record, tuple | list) or len(record) != 2:
            raise IterationError(
                f"iteration '{self.iteration}': its {self.what} input must be (key, value) "
                f"pairs, got {type(record).__name__} {record!r}; map the stream to pairs "
                "before passing it (e.g. .map(lambda r: (r['id'], r['value'])))"
            )
        key, value = record
        if self.also_workset is None:
            return [(key, self.tag, value)]
        return [(key, self.tag, value), (key, self.also_workset, None)]
