"""``autotune status`` read side: worker records and trial owners in a real SQLite study.

Records are written the way the worker registry writes them (study system attributes
``autotune:worker:<name>``, trial system attribute ``autotune:worker``), straight through
the storage, so these tests need nothing of the writer.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import optuna
import pytest
from conftest_results import TrialSpec, frozen_trial, make_study
from optuna.trial import TrialState
from rich.console import Console

from autotune.results import best_estimate, remeasure_key
from autotune.study.status import StudyStatus, study_status
from autotune.study.status_view import format_seconds, render_status, status_json
from autotune.study.workers import (
    TRIAL_WORKER_ATTR,
    WORKER_ATTR_PREFIX,
    WorkerRecord,
    parse_worker_records,
    worker_key,
)

NOW = datetime(2026, 5, 1, 12, 0, 0, tzinfo=timezone.utc)


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).isoformat()


def record(name: str, *, seen_ago_s: float = 2.0, **changes: Any) -> dict[str, Any]:
    """A worker record as the writer stores it (seen ``seen_ago_s`` before NOW)."""
    out: dict[str, Any] = {
        "name": name,
        "host": name.split("/")[0],
        "pid": 4242,
        "deployment": "sim-dsv4-flash-pd",
        "started_at": _iso(NOW - timedelta(hours=1)),
        "seen_at": _iso(NOW - timedelta(seconds=seen_ago_s)),
        "state": "running",
        "trial": None,
        "phase": None,
        "done": 0,
        "heartbeat_s": 5.0,
        "lease_s": 60.0,
    }
    out.update(changes)
    return out


def put_worker(study: optuna.Study, key_name: str, value: Any) -> None:
    study._storage.set_study_system_attr(study._study_id, WORKER_ATTR_PREFIX + key_name, value)


def owned(spec: TrialSpec, worker: str | None, **user_attrs: Any) -> optuna.trial.FrozenTrial:
    trial = frozen_trial(spec, multi=False)
    if worker is not None:
        trial.system_attrs = {**trial.system_attrs, TRIAL_WORKER_ATTR: worker}
    if user_attrs:
        trial.user_attrs = {**trial.user_attrs, **user_attrs}
    return trial


def params(i: int) -> dict[str, Any]:
    """Distinct parameters for i in 0..(4*3*26-1)."""
    return {
        "nccl_proto": ["unset", "LL", "LL128", "Simple"][i % 4],
        "moe_runner_backend": ["marlin", "triton", "cutlass"][i // 4 % 3],
        "mem_fraction_static": round(0.70 + 0.01 * (i // 12 % 26), 2),
        "max_running_requests": 48,
        "cuda_graph": True,
    }


def running_trial(study: optuna.Study, worker: str | None) -> int:
    trial = study.ask()
    if worker is not None:
        study._storage.set_trial_system_attr(trial._trial_id, TRIAL_WORKER_ATTR, worker)
    return trial.number


def text_of(status: StudyStatus, width: int = 120) -> str:
    console = Console(record=True, width=width)
    console.print(render_status(status))
    return console.export_text()


@pytest.fixture()
def busy(tmp_path: Path) -> optuna.Study:
    """Three workers: a live one (a), a lost one (b), a stopped one (c); trials of each."""
    study = make_study(tmp_path, [])
    a, b, c = "gpu1/sim", "gpu2/sim", "gpu3/sim"
    trials = [
        owned(TrialSpec(throughput=100.0, params=params(0), is_baseline=True), a),
        owned(TrialSpec(throughput=300.0, params=params(1)), a),
        owned(TrialSpec(throughput=250.0, params=params(2)), b),
        owned(TrialSpec(params=params(3), failure="cuda_oom"), b),
        owned(TrialSpec(throughput=120.0, params=params(4)), c, aborted="below incumbent"),
        owned(TrialSpec(throughput=300.0, params=params(1)), c, reused_from=1),
        owned(TrialSpec(throughput=900.0, params=params(5), slo_violation=5.0), c),
        owned(TrialSpec(params=params(6), state=TrialState.FAIL), b, failure="worker_lost"),
        owned(TrialSpec(params=params(7), state=TrialState.FAIL), a, failure="interrupted"),
        owned(TrialSpec(throughput=50.0, params=params(8)), None),
    ]
    study.add_trials(trials)
    ta = running_trial(study, a)  # #10: the trial 'a' is on
    tb = running_trial(study, b)  # #11: 'b' died on it
    study.enqueue_trial(params(9))  # #12
    put_worker(study, a, record(a, trial=ta, phase="measure", done=2))
    put_worker(study, b, record(b, seen_ago_s=3600 + 300, trial=tb, phase="warmup", done=2))
    put_worker(study, c, record(c, state="stopped", seen_ago_s=7200, done=3))
    return study


def test_workers_liveness_and_counts(busy: optuna.Study) -> None:
    status = study_status(busy, now=NOW)
    by = {w.name: w for w in status.workers}
    assert [w.name for w in status.workers] == ["gpu1/sim", "gpu2/sim", "gpu3/sim"]

    a = by["gpu1/sim"]
    assert (a.liveness, a.state, a.trial, a.phase) == ("running", "running", 10, "measure")
    assert (a.done, a.done_reported, a.lost_trials, a.running_trials) == (2, 2, 0, 1)
    assert a.seen_ago_s == pytest.approx(2.0)
    assert (a.host, a.pid, a.deployment, a.key) == (
        "gpu1",
        4242,
        "sim-dsv4-flash-pd",
        "autotune:worker:gpu1/sim",
    )

    b = by["gpu2/sim"]
    assert (b.liveness, b.state) == ("lost", "running")
    assert b.trial is None and b.phase is None  # only meaningful while running
    assert b.seen_ago_s == pytest.approx(3900.0)
    assert (b.done, b.lost_trials, b.running_trials) == (2, 1, 1)

    c = by["gpu3/sim"]
    assert (c.liveness, c.trial) == ("stopped", None)
    assert (c.done, c.done_reported) == (3, 3)


def test_done_is_counted_from_trials_not_the_record(busy: optuna.Study) -> None:
    put_worker(busy, "gpu1/sim", record("gpu1/sim", done=99))
    a = next(w for w in study_status(busy, now=NOW).workers if w.name == "gpu1/sim")
    assert (a.done, a.done_reported) == (2, 99)


def test_lease_boundary(tmp_path: Path) -> None:
    study = make_study(tmp_path, [])
    put_worker(study, "w", record("w", seen_ago_s=60.0, lease_s=60.0))
    put_worker(study, "x", record("x", seen_ago_s=60.5, lease_s=60.0))
    put_worker(study, "y", record("y", seen_ago_s=-30.0))  # its clock runs ahead
    live = {w.name: w.liveness for w in study_status(study, now=NOW).workers}
    assert live == {"w": "running", "x": "lost", "y": "running"}


@pytest.mark.parametrize("state", ["stopped", "interrupted", "failed"])
def test_stored_state_of_a_worker_that_ended(tmp_path: Path, state: str) -> None:
    study = make_study(tmp_path, [])
    put_worker(study, "w", record("w", state=state, seen_ago_s=1e6, trial=3, phase="ask"))
    (w,) = study_status(study, now=NOW).workers
    assert (w.liveness, w.trial, w.phase) == (state, None, None)


def test_study_counts(busy: optuna.Study) -> None:
    status = study_status(busy, now=NOW)
    assert status.trials == 13
    assert status.states == {"COMPLETE": 8, "RUNNING": 2, "WAITING": 1, "FAIL": 2}
    assert (status.reused, status.infeasible, status.aborted) == (1, 1, 1)
    assert status.duplicate_configs == 0  # trial 5 reused trial 1's result: not a duplicate
    assert status.unowned_trials == 2  # trial 9 and the waiting trial 12
    assert status.unregistered_owners == {}


def test_best_so_far_matches_best_estimate(busy: optuna.Study) -> None:
    status = study_status(busy, now=NOW)
    expected = best_estimate(busy)
    assert expected is not None and status.best is not None
    assert status.best.trial == expected.trial.number == 1
    assert status.best.mean == pytest.approx(300.0)
    assert status.best.n == 1 and status.best.half_width is None
    assert "300.0 tok/s" in status.best.text
    # Single run: SLO violations (trial 6, 900), aborted (4) and reused (5) do not count.
    assert status.best_run is not None
    assert (status.best_run.trial, status.best_run.throughput) == (1, 300.0)


def test_best_uses_remeasurements(busy: optuna.Study) -> None:
    for repeat, value in ((1, 280.0), (2, 290.0)):
        busy.set_user_attr(
            remeasure_key(1, repeat),
            {
                "of": 1,
                "repeat": repeat,
                "feasible": True,
                "metrics": {"output_throughput": value, "tpot_ms": {"p99": 50.0}},
            },
        )
    best = study_status(busy, now=NOW).best
    assert best is not None
    assert best.n == 3 and best.mean == pytest.approx(290.0)
    assert best.half_width is not None and "95% CI, n=3" in best.text


def test_running_trials(busy: optuna.Study) -> None:
    # Optuna stamps datetime_start in naive local time; "now" is 90 s after it started.
    start = busy.get_trials(deepcopy=False)[10].datetime_start
    assert start is not None
    now = start.astimezone(timezone.utc) + timedelta(seconds=90)
    status = study_status(busy, now=now)
    running = {r.number: r for r in status.running}
    assert sorted(running) == [10, 11]
    assert running[10].worker == "gpu1/sim"
    assert running[10].running_s == pytest.approx(90.0, abs=1.0)
    assert running[11].worker == "gpu2/sim"
    assert running[11].worker_liveness == "lost"


def test_running_trial_phase_from_its_workers_record(busy: optuna.Study) -> None:
    start = busy.get_trials(deepcopy=False)[10].datetime_start
    assert start is not None
    now = start.astimezone(timezone.utc) + timedelta(seconds=5)
    for name in ("gpu1/sim", "gpu2/sim"):
        put_worker(busy, name, {**record(name, trial=10, phase="probe"), "seen_at": _iso(now)})
    running = {r.number: r for r in study_status(busy, now=now).running}
    assert running[10].phase == "probe"
    assert running[11].phase is None  # gpu2's record is on trial 10, not 11
    assert running[11].worker_liveness == "running"


def test_duplicate_configuration_is_counted(tmp_path: Path) -> None:
    study = make_study(tmp_path, [])
    study.add_trials(
        [
            owned(TrialSpec(throughput=200.0, params=params(1)), "a"),
            owned(TrialSpec(throughput=210.0, params=params(1)), "b"),  # raced: measured twice
            owned(TrialSpec(throughput=200.0, params=params(1)), "b", reused_from=0),
            owned(TrialSpec(params=params(2), failure="cuda_oom"), "a"),
            owned(TrialSpec(params=params(2), failure="cuda_oom"), "b"),  # not measured
            owned(TrialSpec(throughput=90.0, params=params(3)), "a"),
        ]
    )
    status = study_status(study, now=NOW)
    assert status.duplicate_configs == 1
    assert status.duplicate_trials == [[0, 1]]
    assert status.unregistered_owners == {"a": 3, "b": 3}
    text = text_of(status)
    assert "duplicate configs measured" in text and "#0, #1" in text


def test_config_key_order_does_not_hide_a_duplicate(tmp_path: Path) -> None:
    study = make_study(tmp_path, [])
    first = owned(TrialSpec(params=params(1)), "a")
    second = owned(TrialSpec(params=params(1)), "b")
    second.user_attrs = {
        **second.user_attrs,
        "config": dict(reversed(list(first.user_attrs["config"].items()))),
    }
    study.add_trials([first, second])
    assert study_status(study, now=NOW).duplicate_configs == 1


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("not json {", "Expecting value"),
        ([1, 2], "not a JSON object but list"),
        ({"name": "m", "host": "h"}, "pid: Field required"),
        (
            {**record("m"), "state": "sleeping"},
            "state: Input should be 'running', 'stopped', 'interrupted' or 'failed'",
        ),
        ({**record("m"), "seen_at": "yesterday"}, "seen_at"),
        ({**record("m"), "lease_s": 0}, "lease_s"),
        (record("other"), "the record is of worker 'other', not of this key"),
    ],
)
def test_malformed_record_is_listed_not_fatal(tmp_path: Path, value: Any, needle: str) -> None:
    study = make_study(tmp_path, [TrialSpec(throughput=10.0)])
    put_worker(study, "ok", record("ok"))
    put_worker(study, "m", value)
    status = study_status(study, now=NOW)
    assert [w.name for w in status.workers] == ["ok"]
    (bad,) = status.unreadable
    assert bad.key == "autotune:worker:m"
    assert needle in bad.error
    text = text_of(status)
    assert "unreadable worker records" in text and "autotune:worker:m" in text
    json.dumps(status_json(status))


def test_extra_keys_are_tolerated_and_json_string_records_read(tmp_path: Path) -> None:
    study = make_study(tmp_path, [])
    put_worker(study, "new", {**record("new"), "gpu_count": 8, "labels": {"rack": "r1"}})
    put_worker(study, "str", json.dumps(record("str")))
    status = study_status(study, now=NOW)
    assert sorted(w.name for w in status.workers) == ["new", "str"]
    assert status.unreadable == []


def test_empty_study(tmp_path: Path) -> None:
    study = make_study(tmp_path, [])
    status = study_status(study, now=NOW)
    assert status.trials == 0
    assert status.states == {"COMPLETE": 0, "RUNNING": 0, "WAITING": 0, "FAIL": 0}
    assert (status.best, status.best_run, status.best_error) == (None, None, None)
    assert status.workers == [] and status.running == [] and status.unreadable == []
    assert status.duplicate_configs == 0
    text = text_of(status)
    assert "no feasible completed trial yet" in text
    assert "no worker has recorded itself" in text
    assert status_json(status)["trials"] == 0


def test_study_without_metric_names(tmp_path: Path) -> None:
    study = optuna.create_study(
        storage=f"sqlite:///{tmp_path / 'plain.db'}", study_name="plain", direction="maximize"
    )
    study.add_trial(owned(TrialSpec(throughput=77.0), None))
    status = study_status(study, now=NOW)
    assert status.best_run is not None and status.best_run.throughput == 77.0
    assert status.best is not None and status.best.trial == 0


def test_malformed_trial_does_not_stop_status(tmp_path: Path) -> None:
    study = make_study(tmp_path, [])
    study.add_trial(owned(TrialSpec(throughput=10.0), "a", services="not a mapping"))
    status = study_status(study, now=NOW)
    assert status.best is None
    assert status.best_error is not None and "trial 0" in status.best_error
    assert "best so far" in text_of(status) and "unavailable" in text_of(status)


def test_one_read_of_trials_and_system_attrs(busy: optuna.Study) -> None:
    storage = busy._storage
    calls: dict[str, int] = {"trials": 0, "system": 0}
    real_trials, real_system = storage.get_all_trials, storage.get_study_system_attrs

    def get_all_trials(*args: Any, **kwargs: Any) -> Any:
        calls["trials"] += 1
        return real_trials(*args, **kwargs)

    def get_study_system_attrs(*args: Any, **kwargs: Any) -> Any:
        calls["system"] += 1
        return real_system(*args, **kwargs)

    storage.get_all_trials = get_all_trials  # type: ignore[method-assign]
    storage.get_study_system_attrs = get_study_system_attrs  # type: ignore[method-assign]
    status = study_status(busy, now=NOW)
    assert status.best is not None
    assert calls == {"trials": 1, "system": 1}


def test_json_output(busy: optuna.Study) -> None:
    data = json.loads(json.dumps(status_json(study_status(busy, now=NOW))))
    assert data["study"] == "autotune-test"
    assert data["as_of"].startswith("2026-05-01T12:00:00")
    assert data["states"]["COMPLETE"] == 8
    assert data["duplicate_configs"] == 0
    assert data["best"]["trial"] == 1 and data["best_run"]["throughput"] == 300.0
    workers = {w["name"]: w for w in data["workers"]}
    assert workers["gpu2/sim"]["liveness"] == "lost"
    assert workers["gpu1/sim"]["phase"] == "measure"
    assert workers["gpu1/sim"]["done"] == 2
    assert [r["number"] for r in data["running"]] == [10, 11]
    assert data["unreadable"] == []


def test_render(busy: optuna.Study) -> None:
    text = text_of(study_status(busy, now=NOW))
    assert "study autotune-test" in text
    assert "13 total: 8 complete, 2 running, 1 waiting, 2 failed" in text
    assert "1 reused, 1 infeasible, 1 aborted early" in text
    assert "trial #1: 300.0 tok/s (n=1, CI unknown" in text
    assert "300.0 tok/s (trial #1)" in text
    lines = {line.split("│")[1].strip(): line for line in text.splitlines() if "/sim" in line}
    assert "running" in lines["gpu1/sim"] and "#10 measure" in lines["gpu1/sim"]
    assert "lost" in lines["gpu2/sim"] and "1h 05m" in lines["gpu2/sim"]
    assert "stopped" in lines["gpu3/sim"] and "2h 00m" in lines["gpu3/sim"]
    assert "running trials" in text


def test_render_escapes_user_strings(tmp_path: Path) -> None:
    study = make_study(tmp_path, [], name="s")
    name = "[bold]evil[/]\nx"
    put_worker(study, name, record(name, host="[link=http://x]h[/link]", phase="[red]p"))
    text = text_of(study_status(study, now=NOW), width=200)  # wide enough not to wrap
    assert "│ [bold]evil[/]\\nx │ [link=http://x]h[/link]:4242 │" in text  # the newline escaped
    assert "│ [red]p │" in text  # "on": no trial, the phase as written


def test_record_model_round_trip() -> None:
    rec = WorkerRecord.model_validate(record("gpu1/sim", trial=3, phase="ask"))
    assert rec.seen == NOW - timedelta(seconds=2)
    assert WorkerRecord.model_validate(json.loads(rec.model_dump_json())) == rec
    assert worker_key("w") == "autotune:worker:w"
    records, bad = parse_worker_records(
        {"autotune:worker:w": record("w"), "autotune:claim:abc": 3, "other": {}}
    )
    assert [r.name for r in records] == ["w"] and bad == []


def test_format_seconds() -> None:
    assert [format_seconds(s) for s in (-3, 0, 59, 61, 3600, 3661, 90000)] == [
        "0s",
        "0s",
        "59s",
        "1m 01s",
        "1h 00m",
        "1h 01m",
        "1d 01h",
    ]
