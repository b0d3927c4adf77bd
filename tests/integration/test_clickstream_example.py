"""``examples/clickstream.py --rescale-to P``, as docs/connectors.md shows it: the job is stopped
with a savepoint mid-run (through the stop registry, as ``python -m jobmanager stop``),
resumed from it at another parallelism while files keep landing, and its PostgreSQL and
Delta tables equal the totals of every generated event, each once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Postgres
from tests.integration.test_examples import load_example

pytestmark = [pytest.mark.harness, pytest.mark.slow]


def test_clickstream_stops_with_a_savepoint_and_resumes_at_another_parallelism(
    postgres: Postgres, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clickstream = load_example("clickstream")
    argv = ["--dsn", postgres.dsn, "--out", str(tmp_path / "out"), "--rescale-to", "3"]
    argv += ["--events", "6000", "--files", "12", "--every", "0.15"]
    code = clickstream.main(argv)
    out = capsys.readouterr().out
    assert "stopped with savepoint" in out, out
    assert code == 0, out
    assert "PostgreSQL user_totals equal the expected totals: YES" in out
    assert "Delta table holds every update exactly once: YES" in out
