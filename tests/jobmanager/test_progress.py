"""The live progress line: drawn on a terminal, silent otherwise."""

from __future__ import annotations

import io

from jobmanager.progress import Progress


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_one_updating_line_on_a_terminal() -> None:
    term = FakeTerminal()
    progress = Progress(None, term)
    progress.update(1_500, 1_200, checkpoints=3, restarts=1, last_checkpoint_ms=42.0)
    progress.next_draw = 0.0  # skip the redraw throttle
    progress.update(3_000, 2_900, checkpoints=4, restarts=1, last_checkpoint_ms=40.0)
    progress.close()
    text = term.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n")
    last = text.rsplit("\r", 1)[1]
    assert "in 3,000" in last and "out 2,900" in last and "rec/s" in last
    assert "chk 4 (40 ms)" in last and "restarts 1" in last


def test_progress_is_quiet_when_not_a_terminal() -> None:
    stream = io.StringIO()
    progress = Progress(None, stream)
    progress.update(10, 10, checkpoints=0, restarts=0, last_checkpoint_ms=None)
    progress.close()
    assert stream.getvalue() == ""


def test_the_dashboard_address_is_announced_and_shown_in_the_line() -> None:
    stream = io.StringIO()  # not a terminal: no progress line, the address still shows
    progress = Progress(None, stream)
    progress.announce("job 'j': dashboard at http://127.0.0.1:8081/?job=j-1")
    assert stream.getvalue() == "job 'j': dashboard at http://127.0.0.1:8081/?job=j-1\n"
    term = FakeTerminal()
    progress = Progress(None, term)
    progress.ui_url = "http://127.0.0.1:8081/?job=j-1"
    progress.update(10, 10, checkpoints=0, restarts=0, last_checkpoint_ms=None)
    assert term.getvalue().rstrip().endswith("ui http://127.0.0.1:8081/?job=j-1")


def test_an_iterations_line_shows_its_superstep() -> None:
    term = FakeTerminal()
    progress = Progress(None, term)
    progress.update(600, 0, checkpoints=2, restarts=1, last_checkpoint_ms=9.0, superstep=7)
    line = term.getvalue().rsplit("\r", 1)[1]
    assert "superstep 7" in line and "restarts 1" in line
    plain = FakeTerminal()
    Progress(None, plain).update(1, 1, checkpoints=0, restarts=0, last_checkpoint_ms=None)
    assert "superstep" not in plain.getvalue()
