"""Claims, worker records and lost trials on real SQLite and PostgreSQL storages."""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy
from optuna.storages._rdb import models
from optuna.trial import TrialState

from autotune.study.claims import claim, claim_key, owner_of, take_over
from autotune.study.storage import batching, open_storage
from autotune.study.workers import (
    TRIAL_WORKER_ATTR,
    Worker,
    WorkerBusy,
    fail_lost_trial,
    lost_trials,
    read_workers,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'study.db'}"
    return str(request.getfixturevalue("pg_url"))


def _study(url: str, name: str = "s") -> optuna.Study:
    storage = batching(open_storage(url, create=True))
    return optuna.create_study(study_name=name, storage=storage, load_if_exists=True)


def test_claim_is_won_once_and_names_the_owner(url: str) -> None:
    study = _study(url)
    key = claim_key("a=1,b=2")
    first = claim(study, key, 3)
    again = claim(study, key, 3)
    other = claim(study, key, 7)
    assert (first.won, first.owner) == (True, 3)
    assert (again.won, again.owner) == (True, 3)  # the owner asking again still owns it
    assert (other.won, other.owner) == (False, 3)
    assert owner_of(study, key) == 3
    assert claim(study, claim_key("a=1,b=3"), 7).won  # another config is free


def test_take_over_is_a_compare_and_swap(url: str) -> None:
    study = _study(url)
    key = claim_key("x")
    claim(study, key, 1)
    assert not take_over(study, key, previous=5, number=9)  # 5 does not own it
    assert take_over(study, key, previous=1, number=9)
    assert not take_over(study, key, previous=1, number=10)  # 9 got it first
    assert owner_of(study, key) == 9


def _claim_in_process(url: str, key: str, number: int, start: float, out: Any) -> None:
    study = optuna.load_study(study_name="s", storage=open_storage(url, create=False))
    while time.time() < start:
        time.sleep(0.001)
    out.put((number, claim(study, key, number).won))


def test_concurrent_claims_from_processes_have_one_winner(url: str) -> None:
    _study(url)
    key = claim_key("contended")
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    start = time.time() + 3.0
    procs = [
        ctx.Process(target=_claim_in_process, args=(url, key, n, start, out)) for n in range(6)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    winners = [n for n, won in results if won]
    assert len(winners) == 1, results
    assert owner_of(_study(url), key) == winners[0]


def test_worker_record_heartbeat_and_stop(url: str) -> None:
    study = _study(url)
    worker = Worker(study, name="w1", deployment="sim", heartbeat_s=0.2, lease_s=2.0)
    worker.start()
    try:
        first = read_workers(study)["w1"]
        assert first is not None and first.state == "running" and first.pid == os.getpid()
        trial = study.ask()
        worker.on_trial(trial)
        worker.on_phase("measure")
        time.sleep(0.8)
        record = read_workers(study)["w1"]
        assert record is not None
        assert (record.trial, record.phase) == (trial.number, "measure")
        assert record.seen_at > first.seen_at
        rdb = study._storage._backend  # type: ignore[attr-defined]
        with rdb.engine.connect() as conn:
            beats = conn.execute(
                sqlalchemy.select(models.TrialHeartbeatModel.__table__.c.heartbeat).where(
                    models.TrialHeartbeatModel.__table__.c.trial_id == trial._trial_id
                )
            ).all()
        assert len(beats) == 1  # the thread beat for the running trial
    finally:
        worker.stop("stopped")
    record = read_workers(study)["w1"]
    assert record is not None and record.state == "stopped" and record.trial is None


def test_a_live_name_is_refused_a_dead_one_is_reused(url: str) -> None:
    study = _study(url)
    now = dt.datetime.now(dt.timezone.utc).isoformat()
    live: dict[str, str | int | float] = {
        "name": "w1", "host": os.uname().nodename, "pid": os.getppid(), "deployment": "sim",
        "started_at": now, "seen_at": now, "state": "running", "lease_s": 60.0,
        "heartbeat_s": 10.0,
    }  # fmt: skip
    study._storage.set_study_system_attr(study._study_id, "autotune:worker:w1", live)
    with pytest.raises(WorkerBusy, match="already running"):
        Worker(study, name="w1", deployment="sim").start()
    dead = dict(live, pid=2**22 + 12345)  # no such process on this host
    study._storage.set_study_system_attr(study._study_id, "autotune:worker:w1", dead)
    worker = Worker(study, name="w1", deployment="sim")
    worker.start()
    worker.stop("stopped")
    # A refused worker never touches the other's record.
    study._storage.set_study_system_attr(study._study_id, "autotune:worker:w1", live)
    refused = Worker(study, name="w1", deployment="sim")
    with pytest.raises(WorkerBusy):
        refused.start()
    refused.stop("failed")
    record = read_workers(study)["w1"]
    assert record is not None and record.state == "running" and record.pid == os.getppid()


def _age_heartbeat(study: optuna.Study, trial_id: int, seconds: float) -> None:
    rdb = study._storage._backend  # type: ignore[attr-defined]
    table = models.TrialHeartbeatModel.__table__
    with rdb.engine.begin() as conn:
        now = conn.execute(
            sqlalchemy.select(sqlalchemy.func.current_timestamp(type_=sqlalchemy.DateTime))
        ).scalar_one()
        conn.execute(
            table.update()
            .where(table.c.trial_id == trial_id)
            .values(heartbeat=now - dt.timedelta(seconds=seconds))
        )


def test_lost_trials_by_heartbeat_and_by_worker_record(url: str) -> None:
    study = _study(url)
    rdb = study._storage._backend  # type: ignore[attr-defined]
    beating, silent, mine, orphan = (study.ask() for _ in range(4))
    for t, owner in ((beating, "a"), (silent, "b"), (mine, "me")):
        study._storage.set_trial_system_attr(t._trial_id, TRIAL_WORKER_ATTR, owner)
        rdb.record_heartbeat(t._trial_id)
    _age_heartbeat(study, silent._trial_id, 30)
    _age_heartbeat(study, mine._trial_id, 30)
    # orphan: no owner, no heartbeat, created long ago (killed between ask and first beat)
    trials = models.TrialModel.__table__
    with rdb.engine.begin() as conn:
        conn.execute(
            trials.update()
            .where(trials.c.trial_id == orphan._trial_id)
            .values(datetime_start=dt.datetime.now() - dt.timedelta(seconds=30))
        )
    lost = lost_trials(study, lease_s=10, exclude_worker="me")
    assert sorted((x.number, x.worker) for x in lost) == [
        (silent.number, "b"),
        (orphan.number, None),
    ]
    by_number = {x.number: x for x in lost}
    silent_s = by_number[silent.number].silent_s
    assert silent_s is not None
    assert silent_s >= 29
    assert lost_trials(study, lease_s=60, exclude_worker="me") == []


def test_fail_lost_trial_once_with_reason(url: str) -> None:
    study = _study(url)
    trial = study.ask()
    trial.suggest_int("x", 0, 9)
    rdb = study._storage._backend  # type: ignore[attr-defined]
    rdb.record_heartbeat(trial._trial_id)
    _age_heartbeat(study, trial._trial_id, 100)
    (lost,) = lost_trials(study, lease_s=5)
    assert fail_lost_trial(study, lost, reason="worker 'b' stopped")
    assert not fail_lost_trial(study, lost, reason="again")  # already FAIL: nobody else
    frozen = study._storage.get_trial(trial._trial_id)
    assert frozen.state == TrialState.FAIL
    assert frozen.user_attrs == {"failure": "worker_lost", "reason": "worker 'b' stopped"}
    assert frozen.params == {"x": trial.params["x"]}
    # A trial completed meanwhile is left alone.
    done = study.ask()
    rdb.record_heartbeat(done._trial_id)
    _age_heartbeat(study, done._trial_id, 100)
    (late,) = lost_trials(study, lease_s=5)
    study.tell(done, 1.0)
    assert not fail_lost_trial(study, late, reason="too late")
    assert study._storage.get_trial(done._trial_id).state == TrialState.COMPLETE
    assert json.dumps(study._storage.get_trial(done._trial_id).user_attrs) == "{}"


def test_a_second_worker_is_refused_where_workers_cannot_share(tmp_path: Path) -> None:
    study = _study(f"sqlite:///{tmp_path / 'study.db'}")
    first = Worker(study, name="w1", deployment="sim")
    first.start(alone=True)
    try:
        with pytest.raises(WorkerBusy, match="need a database server"):
            Worker(study, name="w2", deployment="sim").start(alone=True)
    finally:
        first.stop("stopped")
    second = Worker(study, name="w2", deployment="sim")
    second.start(alone=True)  # the first one stopped: the study is free
    second.stop("stopped")


def _open_in_process(url: str, start: float, out: Any) -> None:
    while time.time() < start:
        time.sleep(0.001)
    try:
        storage = open_storage(url, create=True)
        optuna.create_study(study_name="s", storage=storage, load_if_exists=True)
        out.put("ok")
    except Exception as exc:  # reported to the test
        out.put(f"{type(exc).__name__}: {exc}")


def test_workers_starting_together_on_an_empty_database_all_open_it(pg_url: str) -> None:
    """Each creates Optuna's tables; the losers of that race retry instead of failing."""
    ctx = multiprocessing.get_context("spawn")
    out: Any = ctx.Queue()
    start = time.time() + 3.0
    procs = [ctx.Process(target=_open_in_process, args=(pg_url, start, out)) for _ in range(5)]
    for p in procs:
        p.start()
    results = [out.get(timeout=90) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert results == ["ok"] * 5
    assert len(optuna.get_all_study_names(pg_url)) == 1
