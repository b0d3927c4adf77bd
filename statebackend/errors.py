"""Errors of the state backend: state files, checkpoint directories, spill files.

Every message names the file or checkpoint involved, what is wrong with it, and
what the user can do about it.
"""

from channels.errors import AbsflowError


class StateError(AbsflowError):
    """State cannot be captured, written, read or restored."""


class StorageUsageError(StateError, ValueError):
    """Checkpoint storage was asked for something impossible (a task id that cannot be a
    file name, keeping fewer than one checkpoint)."""


class CorruptStateError(StateError):
    """A state file fails its checks: bad magic, checksum mismatch, truncation.

    ``path`` is the file, ``what`` the check that failed (e.g. ``"crc32 mismatch
    in section count/keyed/kg 17"``).
    """

    def __init__(self, path: str, what: str) -> None:
        self.path = path
        self.what = what
        super().__init__(
            f"corrupt state file {path!r}: {what}; the checkpoint holding it cannot be "
            f"restored — restore an older checkpoint (list them with "
            f"`python -m jobmanager checkpoints DIR`)"
        )


class CheckpointNotFoundError(StateError, FileNotFoundError):
    """No (completed) checkpoint where one was asked for."""


class CorruptCheckpointError(StateError):
    """A checkpoint's ``_metadata`` is unreadable or fails its checksum, or a state file it
    lists is missing or does not match its recorded size/crc32."""


class IncompatibleCheckpointError(StateError, ValueError):
    """A checkpoint's state does not fit the job asked to restore it: a step whose state
    it holds is missing (or of another kind), or cannot be redistributed to the job's
    parallelism. Raised on the driver before any task starts."""


class StorageAccessError(StateError, OSError):
    """Checkpoint storage refused or failed an operation (no such bucket, access denied,
    endpoint unreachable); the message names the URL and the underlying error."""
