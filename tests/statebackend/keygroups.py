"""Shared fakes for the state backend tests: a stable crc32 key-group function."""

import zlib
from collections.abc import Callable
from typing import Any

import msgpack

MAX_PARALLELISM = 128


def crc32_key_group_of(max_parallelism: int = MAX_PARALLELISM) -> Callable[[Any], int]:
    """key -> crc32(msgpack(key)) % max_parallelism (stable across processes)."""

    def key_group_of(key: Any) -> int:
        return zlib.crc32(msgpack.packb(key, use_bin_type=True)) % max_parallelism

    return key_group_of


def key_group_range(index: int, parallelism: int, max_parallelism: int = MAX_PARALLELISM) -> range:
    """Contiguous key groups owned by instance ``index`` of ``parallelism`` (Flink's split)."""
    start = (index * max_parallelism + parallelism - 1) // parallelism
    stop = ((index + 1) * max_parallelism + parallelism - 1) // parallelism
    return range(start, stop)
