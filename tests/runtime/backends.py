"""Run an operator test suite on both keyed state backends: the ``state_backend``
fixture (parametrized "memory" and "rocksdb") makes every keyed operator the tests build
keep its state in that backend (``runtime.operators.KeyedStateBackend`` replaced by a
factory of `RocksDBStateBackend` in a temp directory, with a cache of two entries
per state, so keys go through the store)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statebackend.keyed import KeyedStateBackend

BACKENDS = ["memory", "rocksdb"]


@pytest.fixture(params=BACKENDS)
def state_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "memory":
        yield "memory"
        return
    from statebackend.rocksdb import RocksDBStateBackend

    class TinyCache(RocksDBStateBackend):
        """Two entries cached per state: nearly every access goes through the store."""

        def _size_caches(self) -> None:
            for state in self._states.values():
                state.capacity = 2  # type: ignore[attr-defined]

    made: list[RocksDBStateBackend] = []

    def factory(
        operator: str, max_parallelism: int, key_groups: range, key_group_of: Any
    ) -> KeyedStateBackend:
        backend = TinyCache(
            operator, max_parallelism, key_groups, key_group_of, lambda: str(tmp_path), 1 << 16
        )
        made.append(backend)
        return backend

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr("runtime.operators.KeyedStateBackend", factory)
    try:
        yield "rocksdb"
    finally:
        monkeypatch.undo()
        for backend in made:
            backend.close()
