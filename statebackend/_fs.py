"""Small filesystem helpers shared by the state backend's writers."""

import contextlib
import os
import zlib
from collections.abc import Iterable


def unlink_quietly(path: str) -> None:
    """Remove ``path``; a missing file is fine."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def fsync_dir(directory: str) -> None:
    """Persist renames in ``directory`` (no-op where directories cannot be fsynced)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomically(path: str, chunks: Iterable[bytes]) -> int:
    """Write ``chunks`` to ``path + ".tmp"``, fsync, rename to ``path``, fsync the directory:
    ``path`` either does not exist or is complete. Returns the crc32 of what was written."""
    tmp = path + ".tmp"
    crc = 0
    try:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
                crc = zlib.crc32(chunk, crc)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise
    fsync_dir(os.path.dirname(path) or ".")
    return crc
