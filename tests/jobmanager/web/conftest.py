"""The driver's dashboard server on a free loopback port, closed after the test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jobmanager.web import close_all, serve
from jobmanager.web.server import DashboardServer


@pytest.fixture
def server() -> Iterator[DashboardServer]:
    srv = serve("127.0.0.1", 0, say=lambda _: None)
    yield srv
    close_all()
