"""Fixtures: a fake OpenAI-compatible streaming server, a dead loopback URL and a JSON file
writer (the dataset tests)."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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


@pytest.fixture
def write_json(tmp_path: Path) -> Callable[..., Path]:
    """Writes data as JSON into the test's temporary directory and returns the path."""

    def write(data: Any, name: str = "data.json") -> Path:
        path = tmp_path / name
        path.write_text(json.dumps(data), encoding="utf-8")
        return path

    return write
