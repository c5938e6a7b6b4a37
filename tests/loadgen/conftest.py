"""Fixtures: a fake OpenAI-compatible streaming server and a dead loopback URL."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from fake_openai_server import FakeServer, serve


@pytest.fixture
def fake_server() -> Iterator[FakeServer]:
    with serve() as server:
        yield server


@pytest.fixture
def dead_url() -> str:
    """A loopback URL nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
