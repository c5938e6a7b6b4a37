"""tests/engine_guard.py fails a run in which no real engine was tuned, and only then.

Each case is a real pytest run in a subprocess, on a throw-away project whose two stand-ins for
the real-engine test files pass or skip as the case says; one case runs under pytest-xdist,
where only the controller sees every report.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
MARK = "no real engine was tuned"

CONFTEST = f"""
import sys
from pathlib import Path

sys.path.insert(0, {str(TESTS)!r})
from engine_guard import RealEngineGuard


def pytest_configure(config):
    here = Path(__file__).resolve().parent
    files = [here / "test_vllm_real.py", here / "test_ts_real.py"]
    config.pluginmanager.register(RealEngineGuard(config, files), "real-engine-guard")
"""
PASS = "def test_tuned():\n    assert True\n"
SKIP = "import pytest\n\n\ndef test_tuned():\n    pytest.skip('this CPU cannot run it')\n"
FAIL = "def test_tuned():\n    assert False\n"
SKIP_IN_FIXTURE = (
    "import pytest\n\n\n@pytest.fixture\ndef engine():\n    pytest.skip('no engine')\n\n\n"
    "def test_tuned(engine):\n    pass\n"
)


def _run(
    tmp_path: Path, vllm: str, ts: str, *args: str, require: str | None = "1"
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_vllm_real.py").write_text(vllm)
    (tmp_path / "test_ts_real.py").write_text(ts)
    (tmp_path / "test_other.py").write_text("def test_other():\n    assert True\n")
    env = {k: v for k, v in os.environ.items() if k != "AUTOTUNE_REQUIRE_ENGINES"}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # 0.3 s a run instead of 2 (xdist: -p below)
    if require is not None:
        env["AUTOTUNE_REQUIRE_ENGINES"] = require
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("vllm", "ts", "fails"),
    [
        (SKIP, SKIP, True),  # both skip: an AVX2-only CPU without the transformers env
        (SKIP, PASS, False),  # the transformers-serve study tuned a real engine
        (PASS, SKIP, False),
        (SKIP, SKIP_IN_FIXTURE, True),  # a skip in a fixture (setup) is no pass either
        (PASS + "\n\n" + SKIP.replace("test_tuned", "test_more"), SKIP, True),  # half a file
    ],
    ids=["both-skip", "ts-passed", "vllm-passed", "fixture-skip", "partly-skipped"],
)
def test_the_run_fails_unless_a_real_engine_test_passed(
    tmp_path: Path, vllm: str, ts: str, fails: bool
) -> None:
    proc = _run(tmp_path, vllm, ts)
    out = proc.stdout + proc.stderr
    assert proc.returncode == (1 if fails else 0), out
    assert (MARK in out) == fails, out
    if fails:
        assert "test_ts_real.py" in out and "test_vllm_real.py" in out, out


def test_a_failed_engine_test_still_fails_the_run_and_is_named(tmp_path: Path) -> None:
    proc = _run(tmp_path, SKIP, FAIL)
    assert proc.returncode == 1 and MARK in proc.stdout, proc.stdout
    assert "test_ts_real.py::test_tuned: failed" in proc.stdout, proc.stdout


def test_under_xdist_the_controller_checks_every_workers_reports(tmp_path: Path) -> None:
    failed = _run(tmp_path, SKIP, SKIP, "-p", "xdist", "-n", "2", "--dist", "loadfile")
    assert failed.returncode == 1 and MARK in failed.stdout, failed.stdout + failed.stderr
    passed = _run(tmp_path, SKIP, PASS, "-p", "xdist", "-n", "2", "--dist", "loadfile")
    assert passed.returncode == 0 and MARK not in passed.stdout, passed.stdout + passed.stderr


def test_it_checks_only_when_required_and_only_runs_that_include_the_files(
    tmp_path: Path,
) -> None:
    unset = _run(tmp_path, SKIP, SKIP, require=None)
    assert unset.returncode == 0 and MARK not in unset.stdout, unset.stdout
    off = _run(tmp_path, SKIP, SKIP, require="0")
    assert off.returncode == 0 and MARK not in off.stdout, off.stdout
    other = _run(tmp_path, SKIP, SKIP, "test_other.py")
    assert other.returncode == 0 and MARK not in other.stdout, other.stdout
    # ... but selecting the engine tests away is no way round it
    deselected = _run(tmp_path, PASS, PASS, "-k", "not tuned")
    assert deselected.returncode == 1 and MARK in deselected.stdout, deselected.stdout
