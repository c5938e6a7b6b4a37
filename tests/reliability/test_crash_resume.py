"""``kill -9`` of the tuner at every phase of a trial, then ``autotune run`` again.

Each case arms one fail point (autotune/failpoints.py) with ``kill``: the real process gets
SIGKILL at that exact point of the baseline trial, leaving its services running and the
storage as the kill found it. The next ``autotune run`` must record the trial (measured:
from the journal) or fail it as ``interrupted`` and retry its config (not measured), stop
the orphaned services, and finish the study with every invariant of assert_consistent.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from optuna.trial import TrialState
from reliability_support import (
    alive,
    assert_consistent,
    db_path,
    kill_all,
    run_cli,
    service_pids,
    trials_of,
)

RECORDED_FROM_JOURNAL = ("journal.saved", "storage.mid")
NOT_MEASURED = ("trial.asked", "restart.starting", "restart.ready", "probe", "warmup", "measure")
ALREADY_STORED = ("trial.told",)


@pytest.mark.parametrize("point", NOT_MEASURED + RECORDED_FROM_JOURNAL + ALREADY_STORED)
def test_kill_9_at_any_phase_then_resume(tmp_path: Path, point: str) -> None:
    killed = run_cli(tmp_path, "--trials", "2", failpoints=f"{point}=kill")
    assert killed.returncode == -9, killed.stderr
    assert [name for name, _ in killed.fired] == [point]
    db = db_path(tmp_path)
    runs = tmp_path / "studies" / "runs"
    orphans = service_pids(runs)
    try:
        before = {t.number: t for t in trials_of(db)}
        assert before[0].state == (
            TrialState.COMPLETE if point in ALREADY_STORED else TrialState.RUNNING
        )
        if point not in ("trial.asked", "restart.starting"):
            # The kill left the deployment running (orphaned): the next run must reclaim it.
            assert orphans and all(alive(pid) for pid in orphans.values()), orphans

        resumed = run_cli(tmp_path, "--trials", "2")
        assert resumed.returncode == 0, resumed.stderr
    finally:
        kill_all({n: p for n, p in orphans.items() if alive(p)})
    trials = assert_consistent(db)
    first = trials[0]
    completed = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(completed) == 2
    baseline = [t for t in completed if t.user_attrs.get("is_baseline")]
    assert len(baseline) == 1 and baseline[0].user_attrs["failure"] is None
    if point in NOT_MEASURED:
        assert first.state == TrialState.FAIL
        assert first.user_attrs["failure"] == "interrupted"
        assert baseline[0].user_attrs["retry_of"] == 0
        assert "trial #0 was interrupted earlier" in resumed.stdout + resumed.stderr
    else:
        # Measured before the kill: recorded as measured, not measured again.
        assert (
            first.state == TrialState.COMPLETE
            and first is baseline[0]
            or (first.number == baseline[0].number)
        )
        assert first.user_attrs["metrics"]["completed"] > 0
        assert not any(t.user_attrs.get("retry_of") == 0 for t in trials)
        if point in RECORDED_FROM_JOURNAL:
            assert "recorded now from the journal" in resumed.stdout + resumed.stderr
    assert not any(alive(pid) for pid in orphans.values()), "orphaned services still running"
    assert not any(alive(pid) for pid in service_pids(runs).values())
    assert not list(runs.rglob("journal/*.json")), "journal entries left behind"


def test_kill_9_between_the_retry_and_the_fail_mark(tmp_path: Path) -> None:
    """Recovery enqueues an interrupted trial's retry, then marks it FAIL: killed between
    the two writes, the trial is still RUNNING with its retry waiting, and the next run
    settles it without a second retry (the other order left a FAIL trial nobody retried)."""
    first = run_cli(tmp_path, "--trials", "2", failpoints="warmup=kill")
    assert first.returncode == -9, first.stderr
    runs = tmp_path / "studies" / "runs"
    orphans = service_pids(runs)
    try:
        recovering = run_cli(tmp_path, "--trials", "2", failpoints="retry.enqueued=kill")
        assert recovering.returncode == -9, recovering.stderr
        assert [name for name, _ in recovering.fired] == ["retry.enqueued"]
        db = db_path(tmp_path)
        between = {t.number: t for t in trials_of(db)}
        assert between[0].state == TrialState.RUNNING
        assert [t.user_attrs.get("retry_of") for t in between.values()].count(0) == 1
        assert_consistent(db, finished=False)
        orphans.update(service_pids(runs))
        resumed = run_cli(tmp_path, "--trials", "2")
        assert resumed.returncode == 0, resumed.stderr
    finally:
        kill_all({n: p for n, p in orphans.items() if alive(p)})
    trials = assert_consistent(db)
    assert trials[0].state == TrialState.FAIL
    assert trials[0].user_attrs["failure"] == "interrupted"
    assert [t.user_attrs.get("retry_of") for t in trials].count(0) == 1  # one retry, not two
    baseline = [t for t in trials if t.user_attrs.get("is_baseline")]
    assert [t.state for t in baseline] == [TrialState.FAIL, TrialState.COMPLETE]
