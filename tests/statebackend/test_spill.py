import os
import random
from collections import deque
from pathlib import Path

import pytest

from statebackend import SpillBuffer, StateError


def spill_files(directory: str) -> list[str]:
    return [n for n in os.listdir(directory) if n.startswith("absflow-spill-")]


def test_memory_only_below_threshold(tmp_path: Path) -> None:
    buf = SpillBuffer(str(tmp_path), memory_threshold=100)
    for i in range(10):
        buf.append(bytes([i]) * 10)
    assert buf.in_memory_bytes == 100 and buf.spilled_bytes == 0 and buf.path is None
    assert len(buf) == 10 and buf
    assert [buf.popleft() for _ in range(10)] == [bytes([i]) * 10 for i in range(10)]
    assert not buf and len(buf) == 0
    with pytest.raises(IndexError):
        buf.popleft()


def test_spill_then_replay_then_file_removed(tmp_path: Path) -> None:
    directory = str(tmp_path)
    buf = SpillBuffer(directory, memory_threshold=1000)
    frames = [os.urandom(300) for _ in range(10)]
    for f in frames:
        buf.append(f)
    assert buf.in_memory_bytes == 900
    assert buf.spilled_bytes == 7 * 300
    assert buf.path is not None and spill_files(directory) == [os.path.basename(buf.path)]
    out = [buf.popleft() for _ in range(10)]
    assert out == frames
    assert spill_files(directory) == [] and buf.path is None
    assert buf.spilled_bytes == 2100  # a metric: never decreases


def test_appends_go_to_file_until_it_drains(tmp_path: Path) -> None:
    buf = SpillBuffer(str(tmp_path), memory_threshold=10)
    buf.append(b"a" * 10)  # memory
    buf.append(b"b")  # would exceed: file
    assert buf.popleft() == b"a" * 10 and buf.in_memory_bytes == 0
    buf.append(b"c")  # memory is empty, but the file is not drained: must go behind b
    assert buf.spilled_bytes == 2
    assert buf.popleft() == b"b" and buf.popleft() == b"c"
    buf.append(b"d")  # file drained: memory again
    assert buf.in_memory_bytes == 1 and buf.spilled_bytes == 2


def test_randomized_interleaving_preserves_order(tmp_path: Path) -> None:
    directory = str(tmp_path)
    rng = random.Random(20240507)
    buf = SpillBuffer(directory, memory_threshold=4096)
    model: deque[bytes] = deque()
    spilled = 0
    files_seen = set()
    for step in range(20_000):
        if rng.random() < 0.55 - 0.3 * (step // 2000 % 2):  # phases of growth and drain
            frame = rng.randbytes(rng.choice([0, 1, 50, 700, 3000]))
            if buf.path is not None or buf.in_memory_bytes + len(frame) > 4096:
                spilled += len(frame)
            buf.append(frame)
            model.append(frame)
        elif model:
            assert buf.popleft() == model.popleft()
        else:
            with pytest.raises(IndexError):
                buf.popleft()
        assert len(buf) == len(model)
        if buf.path is not None:
            files_seen.add(buf.path)
    assert buf.spilled_bytes == spilled > 0
    assert len(files_seen) > 1  # files drained, deleted, and new ones created
    while model:
        assert buf.popleft() == model.popleft()
    assert spill_files(directory) == []


def test_close_removes_file_and_is_idempotent(tmp_path: Path) -> None:
    directory = str(tmp_path)
    buf = SpillBuffer(directory, memory_threshold=0)
    buf.append(b"x" * 100)
    assert len(spill_files(directory)) == 1
    buf.close()
    buf.close()
    assert spill_files(directory) == [] and len(buf) == 0
    with pytest.raises(StateError, match="closed"):
        buf.append(b"y")
    with SpillBuffer(directory, memory_threshold=0) as other:
        other.append(b"z")
    assert spill_files(directory) == []


def test_the_directory_is_asked_for_at_the_first_spill_only(tmp_path: Path) -> None:
    asked: list[int] = []

    def directory() -> str:
        asked.append(1)
        return str(tmp_path)

    buf = SpillBuffer(directory, memory_threshold=10)
    buf.append(b"x" * 10)
    assert asked == []
    buf.append(b"y" * 10)
    buf.append(b"z" * 10)
    assert asked == [1] and len(spill_files(str(tmp_path))) == 1
    buf.close()


@pytest.mark.parametrize("threshold", [1 << 20, 25])
def test_rotate_visits_every_frame_in_order_and_keeps_them(tmp_path: Path, threshold: int) -> None:
    buf = SpillBuffer(str(tmp_path), memory_threshold=threshold)
    frames = [bytes([i]) * 10 for i in range(7)]
    for frame in frames:
        buf.append(frame)
    seen: list[bytes] = []
    buf.rotate(seen.append)
    assert seen == frames
    buf.append(b"new")
    assert [buf.popleft() for _ in range(len(buf))] == [*frames, b"new"]
    buf.close()
    assert spill_files(str(tmp_path)) == []
