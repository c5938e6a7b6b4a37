"""``kill -9`` at random moments, again and again, then one run to the end.

Where test_crash_resume.py hits each phase exactly once, this one lets chance pick the
moment (start-up, a storage write, a restart, the load...) over many cycles on one study.
CI runs a short budget; ``pytest -m soak`` the long one (AUTOTUNE_SOAK_CYCLES, default 40).
The seed is printed so a failing sequence can be replayed (AUTOTUNE_SOAK_SEED).
"""

from __future__ import annotations

import os
import random
import time
import uuid
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from reliability_support import (
    STUDY,
    assert_consistent,
    db_path,
    kill_all,
    processes_with_marker,
    run_cli,
    start_cli,
    trials_of,
)

AHEAD = 3
"""Each cycle asks for 3 more trials than the study holds, so there is always work to cut."""


def _has_study(db: Path) -> bool:
    """Whether the study exists: a kill early in a cycle (slow starts on a busy machine) can
    land before the run created it, leaving a database with no study (or no tables) in it:
    nothing stored, nothing to check, and the next cycle creates it."""
    if not db.exists():
        return False
    return STUDY in optuna.get_all_study_names(storage=f"sqlite:///{db}")


def _completed(db: Path) -> int:
    if not _has_study(db):
        return 0
    return len([t for t in trials_of(db) if t.state == TrialState.COMPLETE])


def _soak(tmp_path: Path, cycles: int) -> dict[str, int]:
    seed = int(os.environ.get("AUTOTUNE_SOAK_SEED", random.randrange(10**6)))
    print(f"AUTOTUNE_SOAK_SEED={seed}")
    rng = random.Random(seed)
    marker = uuid.uuid4().hex
    env = {"AUTOTUNE_TEST_MARKER": marker}
    db = db_path(tmp_path)
    kills = 0
    try:
        for _ in range(cycles):
            target = _completed(db) + AHEAD
            proc = start_cli(tmp_path, "--trials", str(target), extra_env=env)
            time.sleep(rng.uniform(0.3, 4.0))
            if proc.poll() is None:
                proc.kill()
                kills += 1
            proc.communicate(timeout=60)
            if _has_study(db):
                assert_consistent(db, finished=False)
        target = _completed(db) + 2
        final = run_cli(tmp_path, "--trials", str(target), extra_env=env, timeout=600)
        assert final.returncode == 0, final.stderr
        left = processes_with_marker(marker)
    finally:
        kill_all({str(p): p for p in processes_with_marker(marker)})
    assert not left, f"orphaned services survived the final run: {left}"
    trials = assert_consistent(db)
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(done) == target
    interrupted = [t for t in trials if t.state == TrialState.FAIL]
    assert all(t.user_attrs["failure"] == "interrupted" for t in interrupted)
    return {
        "cycles": cycles,
        "kills": kills,
        "trials": len(trials),
        "completed": len(done),
        "interrupted": len(interrupted),
    }


def test_random_kill_9_short(tmp_path: Path) -> None:
    print(_soak(tmp_path, cycles=4))


@pytest.mark.soak
def test_random_kill_9_soak(tmp_path: Path) -> None:
    print(_soak(tmp_path, cycles=int(os.environ.get("AUTOTUNE_SOAK_CYCLES", "40"))))
