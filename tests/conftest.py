from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

# Test helper modules (e2e_helpers, conftest_results) live beside the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent))

# The suite sends SIGINT to itself and to the processes it starts (Ctrl-C tests; invoke
# interrupts a remote command that runs past its timeout). Started as a background job of a
# non-interactive shell, pytest would inherit SIGINT ignored and pass that on to every child:
# those tests would test nothing. Python's own handler here means children start with the
# default again.
signal.signal(signal.SIGINT, signal.default_int_handler)

from engine_guard import REAL_ENGINE_TESTS, RealEngineGuard  # noqa: E402
from pg_server import pg_server_fixture, pg_url_fixture  # noqa: E402

# A real PostgreSQL server for the session (tests/pg_server.py), a fresh database per test.
pg_server = pytest.fixture(scope="session", name="pg_server")(pg_server_fixture)
pg_url = pytest.fixture(name="pg_url")(pg_url_fixture)


def pytest_configure(config: pytest.Config) -> None:
    # Under AUTOTUNE_REQUIRE_ENGINES=1 a run fails unless a real engine was tuned
    # (tests/engine_guard.py).
    config.pluginmanager.register(RealEngineGuard(config, REAL_ENGINE_TESTS), "real-engine-guard")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of ``slow`` tests first, each file's own order kept: with ``--dist loadfile``
    xdist hands out files in this order, so the longest (the real vLLM study, ~8 minutes
    beside the rest on 2 cores) start at once instead of ending the run alone."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)
