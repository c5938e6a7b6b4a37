"""Helpers for launcher tests: stand-in services on free loopback ports."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from autotune.launch import LocalLauncher
from autotune.ports import pick_free_port as free_port
from autotune.specs import ServiceSpec

FIXTURE = Path(__file__).parent / "fixtures" / "service.py"


def read_kv(log_file: str | Path) -> list[dict[str, str]]:
    """``key=value`` fields per start (split at the launcher's header lines)."""
    starts: list[dict[str, str]] = []
    for line in Path(log_file).read_text().splitlines():
        if line.startswith("=== autotune: start"):
            starts.append({})
        elif starts and "=" in line and not line.startswith("==="):
            for part in line.split():
                if "=" in part:
                    key, _, value = part.partition("=")
                    starts[-1].setdefault(key, value)
    return starts


class SpecFactory:
    """Builds specs that run fixtures/service.py; one stable free port per service name."""

    free_port = staticmethod(free_port)
    read_kv = staticmethod(read_kv)

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.ports: dict[str, int] = {}

    def __call__(
        self,
        name: str,
        *args: str,
        depends_on: Sequence[str] = (),
        env: dict[str, str] | None = None,
        unset_env: Sequence[str] = (),
        timeout_s: float = 20.0,
        port: int | None = None,
    ) -> ServiceSpec:
        if port is None:
            port = self.ports.setdefault(name, free_port())
        return ServiceSpec(
            name=name,
            argv=(sys.executable, str(FIXTURE), "--port", str(port), *args),
            env=env or {},
            unset_env=tuple(unset_env),
            port=port,
            health_url=f"http://127.0.0.1:{port}/health",
            info_url=f"http://127.0.0.1:{port}/server_info",
            ready_timeout_s=timeout_s,
            log_file=str(self.tmp_path / f"{name}.log"),
            depends_on=tuple(depends_on),
        )


@pytest.fixture
def make_spec(tmp_path: Path) -> SpecFactory:
    return SpecFactory(tmp_path)


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[LocalLauncher]:
    with LocalLauncher(tmp_path, stop_grace_s=2.0, port_wait_s=2.0, poll_interval_s=0.05) as lau:
        yield lau
