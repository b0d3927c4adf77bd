"""One live progress line on a terminal while a job runs; silent when not a TTY."""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

log = logging.getLogger("absflow.jobmanager")


class Progress:
    def __init__(self, enabled: bool | None, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.start = time.monotonic()
        self.next_draw = 0.0
        self.width = 0
        self.ui_url = ""  # the dashboard, shown at the end of the line

    def update(
        self,
        records_in: int,
        records_out: int,
        checkpoints: int,
        restarts: int,
        last_checkpoint_ms: float | None,
        superstep: int | None = None,
    ) -> None:
        """``superstep``: an iteration's superstep running (None: no iteration)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if now < self.next_draw:
            return
        self.next_draw = now + 0.2
        elapsed = now - self.start
        rate = records_in / elapsed if elapsed > 0 else 0.0
        chk = f"  chk {checkpoints}" + (
            f" ({last_checkpoint_ms:.0f} ms)" if last_checkpoint_ms else ""
        )
        step = f"  superstep {superstep}" if superstep is not None else ""
        line = (
            f"in {records_in:,}  out {records_out:,}  {rate:,.0f} rec/s  {elapsed:.1f} s{step}"
            f"{chk if checkpoints else ''}{f'  restarts {restarts}' if restarts else ''}"
            f"{f'  ui {self.ui_url}' if self.ui_url else ''}"
        )
        self.width = max(self.width, len(line))
        self.stream.write("\r" + line.ljust(self.width))
        self.stream.flush()

    def say(self, text: str) -> None:
        """A one-off status line (e.g. waiting for executors): on the terminal when the
        progress line is on, and always in the log."""
        log.info("%s", text)
        if self.enabled:
            self.stream.write("\r" + text.ljust(self.width) + "\n")
            self.stream.flush()

    def announce(self, text: str) -> None:
        """A line the user should see whether or not the progress line is on (the
        dashboard's address): on the progress stream and in the log."""
        log.info("%s", text)
        self.stream.write(("\r" if self.enabled else "") + text.ljust(self.width) + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.width:
            self.stream.write("\n")
            self.stream.flush()
