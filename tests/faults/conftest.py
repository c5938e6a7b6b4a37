"""Fixtures: ``faulty_server.py`` started for real, as a subprocess on a free loopback port."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fault_fixtures import Served, StartServer, start


@pytest.fixture
def start_server() -> Iterator[StartServer]:
    """``start_server(fault, after=N, scope=..., ready_delay=S) -> Served``; all are killed
    (by their own pid) at teardown."""
    started: list[Served] = []

    def start_one(fault: str = "ok", **kwargs: object) -> Served:
        served = start(fault, **kwargs)  # type: ignore[arg-type]
        started.append(served)
        return served

    yield start_one
    for served in started:
        if served.alive():
            served.proc.kill()
        served.proc.wait(5)
        assert served.proc.stdout is not None
        served.proc.stdout.close()
