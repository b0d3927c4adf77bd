"""The state backend's errors (statebackend/errors.py): one root, the builtin each one
also is (so ``except FileNotFoundError`` and friends keep working), and a corrupt file's
message naming the file, the failed check and the fix."""

from __future__ import annotations

import pytest

from channels.errors import AbsflowError
from statebackend.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    CorruptStateError,
    IncompatibleCheckpointError,
    StateError,
    StorageAccessError,
    StorageUsageError,
)


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (StorageUsageError, ValueError),
        (CheckpointNotFoundError, FileNotFoundError),
        (IncompatibleCheckpointError, ValueError),
        (StorageAccessError, OSError),
    ],
)
def test_each_error_is_a_state_error_and_its_builtin(
    error: type[StateError], builtin: type[Exception]
) -> None:
    with pytest.raises(builtin):
        raise error("x")
    assert issubclass(error, StateError) and issubclass(StateError, AbsflowError)


def test_a_corrupt_checkpoint_is_not_mistaken_for_a_missing_one() -> None:
    assert not issubclass(CorruptCheckpointError, FileNotFoundError)
    assert not issubclass(CorruptStateError, OSError)


def test_corrupt_state_names_the_file_the_check_and_the_fix() -> None:
    err = CorruptStateError("/ck/chk-3/count[0].state", "crc32 mismatch in section count/kg 17")
    assert err.path == "/ck/chk-3/count[0].state"
    assert err.what == "crc32 mismatch in section count/kg 17"
    message = str(err)
    assert message.startswith("corrupt state file '/ck/chk-3/count[0].state': crc32 mismatch")
    assert "restore an older checkpoint" in message
    assert "python -m jobmanager checkpoints DIR" in message
