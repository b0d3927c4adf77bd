"""Which embedded store holds keyed state larger than memory: RocksDB (``rocksdict``)
against LMDB (``lmdb``), at ~1 M keys, as absflow's disk-backed state backend uses one.

Keys are as the backend writes them: a 2-byte big-endian key group, then the msgpack
bytes of the key (so a key group is a key range); values are small msgpack ints.
Measured, each in a fresh directory:

* **put**: 1 M keys written in batches of 10,000 (the backend writes back its dirty keys
  in batches before a snapshot);
* **get**: 200,000 random point reads of present keys (a cache miss);
* **miss**: 200,000 reads of absent keys (a key seen the first time);
* **scan**: all keys of 16 of 128 key groups, by prefix (a rescale reads key-group ranges);
* **checkpoint**: the store's own copy of its state: RocksDB's checkpoint hard-links its
  immutable SST files (cost: a flush and the links; what a later checkpoint must upload
  is only the new files); LMDB's ``copy`` writes the whole file every time;
* **checkpoint after 1 % changed**: the same after updating 10,000 keys, and the bytes
  that are new against the previous checkpoint (what an incremental upload sends).

    python benchmarks/state_store.py [--keys 1000000]

Writes ``benchmarks/results/state_store.json``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.results import write_result

GROUPS = 128
BATCH = 10_000


def _key(k: int) -> bytes:
    return (k % GROUPS).to_bytes(2, "big") + msgpack.packb(k)


def _timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _files(path: str) -> dict[str, tuple[int, int]]:
    """name -> (inode, size) of the files under ``path``."""
    out = {}
    for name in os.listdir(path):
        st = os.stat(os.path.join(path, name))
        out[name] = (st.st_ino, st.st_size)
    return out


def _new_bytes(prev: dict[str, tuple[int, int]], cur: dict[str, tuple[int, int]]) -> int:
    """Bytes of ``cur`` not hard links of (nor named as) an immutable file of ``prev``."""
    old_inodes = {ino for ino, _ in prev.values()}
    return sum(size for ino, size in cur.values() if ino not in old_inodes)


def bench_rocksdb(root: str, keys: int) -> dict[str, float]:
    import rocksdict

    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    db = rocksdict.Rdict(os.path.join(root, "db"), opts)
    rng = random.Random(1)
    ks = [_key(k) for k in range(keys)]
    val = msgpack.packb(12345)

    def put() -> None:
        for i in range(0, keys, BATCH):
            wb = rocksdict.WriteBatch(raw_mode=True)
            for k in ks[i : i + BATCH]:
                wb.put(k, val)
            db.write(wb)

    figures: dict[str, float] = {"put_s": _timed(put)}
    sample = rng.sample(ks, 200_000)
    get = db.get
    figures["get_s"] = _timed(lambda: [get(k) for k in sample])
    absent = [_key(keys + i) for i in range(200_000)]
    figures["miss_s"] = _timed(lambda: [get(k) for k in absent])

    def scan() -> int:
        n = 0
        for g in range(16):
            prefix = g.to_bytes(2, "big")
            it = db.iter()
            it.seek(prefix)
            while it.valid():
                k = it.key()
                if not k.startswith(prefix):
                    break
                n += 1
                it.next()
        return n

    figures["scan_s"] = _timed(scan)
    figures["scan_keys"] = scan()
    cp1 = os.path.join(root, "cp1")
    figures["checkpoint_s"] = _timed(
        lambda: (db.flush(), rocksdict.Checkpoint(db).create_checkpoint(cp1))
    )
    figures["checkpoint_bytes"] = sum(s for _, s in _files(cp1).values())
    wb = rocksdict.WriteBatch(raw_mode=True)
    for k in rng.sample(ks, keys // 100):
        wb.put(k, msgpack.packb(7))
    db.write(wb)
    cp2 = os.path.join(root, "cp2")
    figures["checkpoint_1pct_s"] = _timed(
        lambda: (db.flush(), rocksdict.Checkpoint(db).create_checkpoint(cp2))
    )
    figures["checkpoint_1pct_new_bytes"] = _new_bytes(_files(cp1), _files(cp2))
    db.close()
    return figures


def bench_lmdb(root: str, keys: int) -> dict[str, float]:
    import lmdb

    env = lmdb.open(os.path.join(root, "db"), map_size=1 << 34, sync=False, writemap=True)
    rng = random.Random(1)
    ks = [_key(k) for k in range(keys)]
    val = msgpack.packb(12345)

    def put() -> None:
        for i in range(0, keys, BATCH):
            with env.begin(write=True) as txn:
                for k in ks[i : i + BATCH]:
                    txn.put(k, val)

    figures: dict[str, float] = {"put_s": _timed(put)}
    sample = rng.sample(ks, 200_000)
    absent = [_key(keys + i) for i in range(200_000)]
    with env.begin() as txn:
        get = txn.get
        figures["get_s"] = _timed(lambda: [get(k) for k in sample])
        figures["miss_s"] = _timed(lambda: [get(k) for k in absent])

    def scan() -> int:
        n = 0
        with env.begin() as txn:
            cur = txn.cursor()
            for g in range(16):
                prefix = g.to_bytes(2, "big")
                if not cur.set_range(prefix):
                    continue
                for k in cur.iternext(values=False):
                    if not k.startswith(prefix):
                        break
                    n += 1
        return n

    figures["scan_s"] = _timed(scan)
    figures["scan_keys"] = scan()
    cp1 = os.path.join(root, "cp1")
    os.makedirs(cp1)
    figures["checkpoint_s"] = _timed(lambda: (env.sync(True), env.copy(cp1, compact=False)))
    figures["checkpoint_bytes"] = sum(s for _, s in _files(cp1).values())
    with env.begin(write=True) as txn:
        for k in rng.sample(ks, keys // 100):
            txn.put(k, msgpack.packb(7))
    cp2 = os.path.join(root, "cp2")
    os.makedirs(cp2)
    figures["checkpoint_1pct_s"] = _timed(lambda: (env.sync(True), env.copy(cp2, compact=False)))
    figures["checkpoint_1pct_new_bytes"] = _new_bytes(_files(cp1), _files(cp2))
    env.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    args = parser.parse_args()
    results: dict[str, Any] = {"keys": args.keys}
    for name, bench in (("rocksdb", bench_rocksdb), ("lmdb", bench_lmdb)):
        root = tempfile.mkdtemp(prefix=f"absflow-store-{name}-")
        try:
            figures = bench(root, args.keys)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        results[name] = figures
        n = args.keys
        print(
            f"{name:8s} put {n / figures['put_s'] / 1e3:7.0f} k/s  "
            f"get {200_000 / figures['get_s'] / 1e3:6.0f} k/s  "
            f"miss {200_000 / figures['miss_s'] / 1e3:6.0f} k/s  "
            f"scan {figures['scan_keys'] / figures['scan_s'] / 1e3:6.0f} k/s  "
            f"checkpoint {figures['checkpoint_s'] * 1e3:6.0f} ms "
            f"({figures['checkpoint_bytes'] / 1e6:.1f} MB)  "
            f"after 1 %: {figures['checkpoint_1pct_s'] * 1e3:5.0f} ms, "
            f"{figures['checkpoint_1pct_new_bytes'] / 1e6:.2f} MB new"
        )
    write_result("state_store", results)


if __name__ == "__main__":
    main()
