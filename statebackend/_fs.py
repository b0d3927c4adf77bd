"""Small filesystem helpers shared by the state backend's writers."""

import contextlib
import os


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
