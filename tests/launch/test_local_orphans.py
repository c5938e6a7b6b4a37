"""A tuner killed between starting a service and recording it leaves a process no
``state.json`` names; the next manager on that run directory finds it by the variable every
service it starts carries, and stops it with the other leftovers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.remote.managers.local import RUN_DIR_VAR, LocalManager

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _spawn(env_dir: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, RUN_DIR_VAR: str(env_dir.resolve())}
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        env=env,
        start_new_session=True,
    )


def test_an_unrecorded_service_of_a_killed_session_is_stopped(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    other_dir = tmp_path / "other"
    orphan, bystander = _spawn(run_dir), _spawn(other_dir)
    try:
        time.sleep(0.2)  # the environment is readable once exec is done
        manager = LocalManager(run_dir, stop_grace_s=2.0)
        assert f"unrecorded-{orphan.pid}" in manager._leftovers
        assert f"unrecorded-{bystander.pid}" not in manager._leftovers  # another run dir's
        events: list[tuple[str, str]] = []
        manager.stop_leftovers(lambda name, what: events.append((name, what)))
        assert orphan.wait(timeout=10) is not None
        assert (f"unrecorded-{orphan.pid}", "stopping leftover") in events
        assert bystander.poll() is None  # untouched
    finally:
        for proc in (orphan, bystander):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
