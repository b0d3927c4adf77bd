"""Superstep checkpoints on the streaming checkpoints' storage: a storage URL
(``s3://`` on moto's server) with ``storage_options``, a kill and a pessimistic restore
that reads the checkpoint back from the object store."""

from __future__ import annotations

import socket

import pytest

from runtime.iterations import Recovery
from runtime.iterations.api import RecoveryMode
from runtime.iterations.graphs import union_find_labels
from runtime.iterations.snapshots import SuperstepStore, write_whole
from tests.conftest import FakeS3
from tests.iterations.graphs import CC_EDGES, N_CC, components

CC_REF = union_find_labels(N_CC, CC_EDGES)


def _keys(s3: FakeS3, prefix: str) -> list[str]:
    listing = s3.client().list_objects_v2(Bucket=s3.bucket, Prefix=prefix)
    return sorted(o["Key"] for o in listing.get("Contents", []))


def test_superstep_store_on_s3_counts_a_superstep_only_with_its_metadata(
    s3: FakeS3, s3_root: str
) -> None:
    store = SuperstepStore(s3_root, s3.options)
    for k in (1, 2, 3):
        for i in range(2):
            write_whole(
                store, k, i, {i * 10 + j: float(k) for j in range(5)}, {i}, attempt=1
            ).wait()
    assert store.completed() == []  # parts without _metadata do not count
    store.complete(1, 2, attempt=1)
    store.complete(2, 2, attempt=1)
    store.complete(3, 2, attempt=1, retain=2)
    assert store.completed() == [2, 3]  # superstep 1 dropped: retain 2
    assert store.read_part(3, 1) == ({10 + j: 3.0 for j in range(5)}, {1})
    prefix = s3_root.removeprefix(f"s3://{s3.bucket}/")
    assert not [k for k in _keys(s3, prefix) if "/sstep-1/" in k]


@pytest.mark.parametrize("mode", ["blocking", "tail", "head"])
def test_kill_then_pessimistic_restore_from_s3_gives_the_exact_components(
    mode: RecoveryMode, s3: FakeS3, s3_root: str
) -> None:
    recovery = Recovery(mode, interval=2, checkpoint_dir=s3_root, storage_options=s3.options)
    result = components().run(recovery=recovery, kills=[(1, 5)], launcher="threads")
    assert result.solution == CC_REF
    (rec,) = result.recoveries
    assert rec.kind == "checkpoint" and rec.resumed_from in (2, 4)
    root = result.checkpoint_root
    assert root is not None and root.startswith(s3_root + "/")
    keys = _keys(s3, root.removeprefix(f"s3://{s3.bucket}/"))
    assert any(k.endswith(f"/checkpoints/sstep-{result.checkpoints[-1]}/_metadata") for k in keys)
    assert any("/checkpoints/sstep-" in k and "/part-0-a" in k for k in keys)
    assert not any(k.endswith(".tmp") for k in keys)


def test_unreachable_storage_fails_naming_the_url_and_the_cause(s3: FakeS3, s3_root: str) -> None:
    # a loopback port nobody listens on: bound (not listening) for the whole test, so no
    # other test or xdist worker can take it meanwhile; a connect to it is refused
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        options = {**s3.options, "endpoint_url": f"http://127.0.0.1:{port}"}
        recovery = Recovery("blocking", interval=2, checkpoint_dir=s3_root, storage_options=options)
        with pytest.raises(
            OSError, match=r"superstep checkpoint s3://.*failed: .*(onnect|refused)"
        ):
            components().run(recovery=recovery, launcher="threads")
