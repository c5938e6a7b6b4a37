"""Ctrl-C (SIGINT) and SIGTERM at every phase of a trial.

The signal is sent by the process to itself at a fail point, so each phase is hit exactly.
The run must stop within seconds, exit 130, say what it stopped and how to restore, leave no
service running and no trial RUNNING, and resume with the same command.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from e2e_helpers import E2E_STUDY
from optuna.trial import TrialState
from reliability_support import (
    assert_consistent,
    db_path,
    kill_all,
    processes_with_marker,
    run_cli,
)

NOT_MEASURED = ("trial.asked", "restart.starting", "restart.ready", "probe", "warmup", "measure")
MEASURED = ("journal.saved", "storage.mid")
STOP_WITHIN_S = 5.0

# SIGTERM becomes the same KeyboardInterrupt as Ctrl-C (study/interrupts.py
# sigterm_as_interrupt): one phase before the measurement and one while storing show it.
CASES = [(p, "sigint") for p in NOT_MEASURED + MEASURED] + [
    (p, "sigterm") for p in ("restart.starting", "storage.mid")
]


@pytest.mark.parametrize(("point", "signal_name"), CASES)
def test_interrupt_at_any_phase(tmp_path: Path, point: str, signal_name: str) -> None:
    marker = uuid.uuid4().hex
    env = {"AUTOTUNE_TEST_MARKER": marker}
    try:
        run = run_cli(tmp_path, "--trials", "2", failpoints=f"{point}={signal_name}", extra_env=env)
        left = processes_with_marker(marker)
    finally:
        kill_all({str(pid): pid for pid in processes_with_marker(marker)})
    assert run.returncode == 130, run.stderr
    assert [name for name, _ in run.fired] == [point]
    stop_seconds = run.ended_at - run.fired[0][1]
    assert stop_seconds < STOP_WITHIN_S, f"took {stop_seconds:.1f} s to stop"
    print(f"{point} {signal_name}: stopped {stop_seconds:.2f} s after the signal")
    assert not left, f"services left running: {left}"
    err = " ".join(run.stderr.split())
    assert "interrupted after" in err
    assert "nothing autotune started is left running" in err
    assert "autotune restore --study rel" in err
    assert "Resume with the same command" in err
    assert "Traceback" not in run.stderr

    db = db_path(tmp_path)
    trials = assert_consistent(db)
    first = trials[0]
    if point in NOT_MEASURED:
        assert first.state == TrialState.FAIL
        assert first.user_attrs["failure"] == "interrupted"
        assert "Ctrl-C/SIGTERM" in first.user_attrs["reason"]
    else:  # the signal waited for the storage write: the measured trial is kept
        assert first.state == TrialState.COMPLETE
        assert first.user_attrs["metrics"]["completed"] > 0

    resumed = run_cli(tmp_path, "--trials", "2", extra_env=env)
    assert resumed.returncode == 0, resumed.stderr
    trials = assert_consistent(db)
    assert len([t for t in trials if t.state == TrialState.COMPLETE]) == 2
    assert not processes_with_marker(marker)


def test_second_ctrl_c_leaves_services_running_and_says_how_to_stop_them(
    tmp_path: Path,
) -> None:
    marker = uuid.uuid4().hex
    env = {"AUTOTUNE_TEST_MARKER": marker}
    try:
        run = run_cli(
            tmp_path, "--trials", "2", failpoints="measure=sigint,winddown=sigint", extra_env=env
        )
        left = processes_with_marker(marker)
        assert run.returncode == 130, run.stderr
        assert [name for name, _ in run.fired] == ["measure", "winddown"]
        err = " ".join(run.stderr.split())
        assert "Left running: prefill, decode, router" in err
        assert "autotune restore --study rel" in err
        assert left, "the second Ctrl-C should have left the services running"
        assert_consistent(db_path(tmp_path))

        restore = run_cli_restore(tmp_path)
        assert restore.returncode == 0, restore.stderr
        assert not processes_with_marker(marker)
    finally:
        kill_all({str(pid): pid for pid in processes_with_marker(marker)})


def run_cli_restore(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autotune", "restore", "--study", "rel",
         "--study-file", str(E2E_STUDY)],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
