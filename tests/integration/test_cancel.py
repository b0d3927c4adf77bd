"""Ctrl-C twice during run() (the first asks for a stop with a savepoint, the second
aborts at once): the tasks end, every port and temp dir is released, and the caller gets
a JobCancelledError without a chained traceback."""

from __future__ import annotations

import _thread
import logging
from typing import Any

import pytest

from runtime import JobCancelledError
from tests.integration.topologies import pipeline

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leaks")]


class CtrlCTwice(logging.Handler):
    """Presses Ctrl-C (SIGINT, as a terminal sends it) once every task registered, and
    again as soon as the first one started a stop with savepoint. Not after a fixed
    delay: a first Ctrl-C before run() installed its handlers ends it another way."""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "tasks registered" in message or "stopping job" in message:
            _thread.interrupt_main()


def test_a_second_ctrl_c_cancels_the_job_and_cleans_up(caplog: Any) -> None:
    presses = CtrlCTwice()
    logging.getLogger("absflow").addHandler(presses)
    try:
        with (
            caplog.at_level(logging.INFO, logger="absflow"),
            pytest.raises(JobCancelledError) as info,
        ):
            pipeline(400_000, checkpoint_interval=0.2).run()  # ~50 s if left alone
    finally:
        logging.getLogger("absflow").removeHandler(presses)
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert "cancelled" in str(info.value)
    messages = [r.getMessage() for r in caplog.records]
    assert any("processes and ports gone" in m for m in messages), messages
