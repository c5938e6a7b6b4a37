"""``autotune.study.migrate``: a study moved between real storages (SQLite files, a real
PostgreSQL server) arrives whole, is verified, and a refused, failed or interrupted
migration leaves nothing in the target and never touches the source.

The study is written through the tuner's own code path (space suggestions in one batch,
``finish_trial``, ``fail_trial``, enqueued baseline and retry, re-measurements and worker
coordination attributes), so what is compared is what a real study holds.
"""

from __future__ import annotations

import hashlib
import math
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from conftest_results import metrics, services
from e2e_helpers import REPO, autotune_cli
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.study import StudyDirection
from optuna.trial import TrialState
from pg_server import pg_server_fixture, pg_url_fixture

from autotune import results
from autotune.errors import StorageError
from autotune.space import load_space
from autotune.study import migrate
from autotune.study.definition import SLOSettings
from autotune.study.migrate import MigrationReport, compare_studies, migrate_study
from autotune.study.objectives import Objective
from autotune.study.record import fail_trial, finish_trial
from autotune.study.storage import (
    batched_writes,
    batching,
    create_or_load_study,
    open_storage,
)
from autotune.trial import TrialOutcome, TrialRecord, failed
from autotune.trial.record import SCHEMA_VERSION

# Exactly what tests/conftest.py is to get; shadowed by it once it has them.
pg_server = pytest.fixture(scope="session", name="pg_server")(pg_server_fixture)
pg_url = pytest.fixture(name="pg_url")(pg_url_fixture)

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = REPO / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml"
OBJECTIVE = Objective(kind="throughput", slo=SLOSettings(tpot_p99_ms=80.0, max_error_rate=0.0))
NAME = "mig"
THROUGHPUTS: list[float | None] = [100.0, 140.0, None, 180.0, 120.0]
"""Trials 0 (the baseline) to 4; None: a configuration that crashed (infeasible)."""
WORKER: dict[str, Any] = {
    "name": "host-a/sim",
    "host": "host-a",
    "pid": 4242,
    "deployment": "sim-dsv4-flash-pd.yaml",
    "started_at": "2025-01-01T10:00:00+00:00",
    "seen_at": "2025-01-01T10:05:00+00:00",
    "state": "stopped",
    "trial": None,
    "phase": None,
    "done": 5,
    "heartbeat_s": 5.0,
    "lease_s": 60.0,
}


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def build_study(url: str, name: str = NAME) -> None:
    """The realistic study: baseline, measured, crashed, interrupted (FAIL) trials, a WAITING
    retry, re-measurements, the correctness reference and worker coordination attributes."""
    space = load_space(SPACE)
    storage = open_storage(url, create=True)
    study = create_or_load_study(
        name,
        batching(storage),
        directions=OBJECTIVE.directions,
        sampler=optuna.samplers.RandomSampler(seed=7),
        metric_names=OBJECTIVE.metric_names,
    )
    study.enqueue_trial(space.baseline_params(), user_attrs={"is_baseline": True})
    for throughput in THROUGHPUTS:
        trial = study.ask()
        with batched_writes(study, trial._trial_id):
            config = space.suggest(trial)
        study._storage.set_trial_system_attr(trial._trial_id, "autotune:worker", WORKER["name"])
        attrs: dict[str, Any] = {
            "config": config,
            "services": services({}, env={"HF_TOKEN": "hf_secretsecretsecret"}),
            "phase_seconds": {"restart": 40.0, "probe": 1.0, "warmup": 5.0, "measure": 30.0},
            "is_baseline": bool(trial.user_attrs.get("is_baseline", False)),
            "reused_from": None,
            "effective": {"decode": {"mem_fraction_static": 0.85}},
            "overrides": [],
            "deployment": "sim-dsv4-flash-pd.yaml",
            "restarted": ["prefill", "decode", "router"],
            "sim_speedup": 12.5,
        }
        if throughput is None:
            outcome = failed(
                OBJECTIVE,
                TrialRecord.from_attrs(attrs),
                failure="cuda_oom",
                reason="decode: CUDA out of memory",
                log_tail="torch.OutOfMemoryError: CUDA out of memory",
            )
        else:
            measured = metrics(throughput, 50.0)
            attrs.update(metrics=measured, failure=None, reason="", log_tail="")
            outcome = TrialOutcome(
                values=OBJECTIVE.values(measured),
                constraints=OBJECTIVE.constraints(measured),
                record=TrialRecord.from_attrs(attrs),
            )
        finish_trial(study, trial, outcome, constraint_keys=OBJECTIVE.constraint_keys)
    interrupted = study.ask()
    with batched_writes(study, interrupted._trial_id):
        space.suggest(interrupted)
    fail_trial(study, interrupted, failure="interrupted", reason="the tuner stopped")
    study.enqueue_trial(dict(interrupted.params), user_attrs={"retry_of": interrupted.number})
    for of, repeat, throughput in ((3, 1, 176.0), (1, 1, 143.0), (3, 2, 171.0)):
        measured = metrics(throughput, 50.0)
        study.set_user_attr(
            results.remeasure_key(of, repeat),
            {
                "of": of,
                "repeat": repeat,
                "values": OBJECTIVE.values(measured),
                "constraints": OBJECTIVE.constraints(measured),
                "feasible": True,
                "metrics": measured,
                "phase_seconds": {"restart": 41.0, "measure": 30.0},
                "failure": None,
                "reason": "",
            },
        )
    study.set_user_attr("reference_output", "The sky is blue because of Rayleigh")
    storage.set_study_system_attr(study._study_id, f"autotune:worker:{WORKER['name']}", WORKER)
    storage.set_study_system_attr(study._study_id, "autotune:claim:abc", 3)
    storage.engine.dispose()  # type: ignore[attr-defined]


def build_edge_study(url: str, name: str = "edges") -> None:
    """Two objectives, infinite values, NaN intermediate values and attributes, every kind
    of distribution, a constraint set through Optuna's own API."""
    storage = open_storage(url, create=True)
    study = optuna.create_study(
        study_name=name,
        storage=storage,
        directions=[StudyDirection.MAXIMIZE, StudyDirection.MINIMIZE],
    )
    study.set_metric_names(["a", "b"])
    for i in range(3):
        trial = study.ask()
        trial.suggest_float("lr", 1e-5, 1e-1, log=True)
        trial.suggest_float("frac", 0.5, 0.95, step=0.05)
        trial.suggest_int("n", 8, 128, step=8)
        trial.suggest_categorical("mode", [None, True, 2, 2.5, "x"])
        for step, value in enumerate((0.5, math.nan, -math.inf)):  # report() is 1-objective
            storage.set_trial_intermediate_value(trial._trial_id, step, value)
        trial.set_user_attr("nan", math.nan)
        trial.set_user_attr("nested", {"ü": [1, 1.0, None, "\n"]})
        trial.set_user_attr("big", "x" * 20000)
        storage.set_trial_system_attr(trial._trial_id, "constraints:c", float(i - 1))
        study.tell(trial, [math.inf if i == 0 else 1.0 / (i + 1), -math.inf if i == 1 else i])
    study.add_trial(
        optuna.trial.create_trial(
            state=TrialState.PRUNED,
            params={"n": 16},
            distributions={"n": IntDistribution(8, 128, step=8)},
            intermediate_values={0: 1.0},
        )
    )
    storage.engine.dispose()  # type: ignore[attr-defined]


def open_study(url: str, name: str = NAME) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=open_storage(url, create=False))


def assert_same(a_url: str, b_url: str, name: str = NAME) -> None:
    """Field by field, and what autotune.results reads from them."""
    a_storage = open_storage(a_url, create=False)
    b_storage = open_storage(b_url, create=False)
    assert compare_studies(a_storage, b_storage, name) == []
    if name != NAME:
        return
    a, b = open_study(a_url, name), open_study(b_url, name)
    assert results.load_results(a) == results.load_results(b)
    assert results.load_remeasurements(a) == results.load_remeasurements(b)
    assert results.config_estimates(a) == results.config_estimates(b)
    best_a, best_b = results.best_estimate(a), results.best_estimate(b)
    assert best_a is not None and best_a == best_b
    assert best_a.trial.number == 3 and best_a.remeasured == 2
    assert results.baseline_trial(a) == results.baseline_trial(b)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The realistic study (plus the edge-case one), built once; tests copy the file."""
    path = tmp_path_factory.mktemp("built") / "source.db"
    build_study(sqlite_url(path))
    build_edge_study(sqlite_url(path))
    return path


@pytest.fixture
def source(built: Path, tmp_path: Path) -> Path:
    path = tmp_path / "source.db"
    path.write_bytes(built.read_bytes())
    return path


def only(study_db: Path, name: str, tmp_path: Path) -> Path:
    """A copy of ``study_db`` holding just study ``name``."""
    path = tmp_path / f"only-{name}.db"
    path.write_bytes(study_db.read_bytes())
    storage = open_storage(sqlite_url(path), create=False)
    for s in storage.get_all_studies():
        if s.study_name != name:
            storage.delete_study(s._study_id)
    storage.engine.dispose()  # type: ignore[attr-defined]
    return path


# --------------------------------------------------------------------------- SQLite -> SQLite


def test_sqlite_to_sqlite_copies_everything_and_results_read_the_same(
    source: Path, tmp_path: Path
) -> None:
    before = digest(source), source.stat().st_mtime_ns
    target = tmp_path / "new" / "target.db"
    lines: list[str] = []
    report = migrate_study(
        source_url=sqlite_url(source),
        target_url=sqlite_url(target),
        study_name=NAME,
        progress=lines.append,
    )
    assert isinstance(report, MigrationReport)
    assert report.verified and report.method == "rows"
    assert report.trials == {"COMPLETE": 5, "FAIL": 1, "WAITING": 1}
    assert report.total_trials == 7
    assert report.study_user_attrs == 4  # 3 re-measurements + reference_output
    assert report.study_system_attrs == 3  # metric names, the worker, the claim
    assert report.directions == ["maximize"]
    assert report.seconds > 0
    assert "7 trials (5 complete, 1 fail, 1 waiting)" in lines[0]
    assert lines[-1] == "verifying the copy field by field"
    assert (digest(source), source.stat().st_mtime_ns) == before  # never written
    assert_same(sqlite_url(source), sqlite_url(target))

    copied = open_study(sqlite_url(target))
    assert copied.metric_names == OBJECTIVE.metric_names
    waiting = copied.get_trials(states=(TrialState.WAITING,))
    assert [t.user_attrs for t in waiting] == [{"retry_of": 5}]
    assert waiting[0].system_attrs["fixed_params"] == copied.trials[5].params
    trial = copied.trials[3]
    assert trial.system_attrs["autotune:worker"] == "host-a/sim"
    assert trial.constraints["slo_tpot_p99_ms"] == -30.0
    assert trial.system_attrs["constraints"] == [0.0, -30.0, 0.0]
    assert trial.user_attrs["services"]["decode"]["env"]["HF_TOKEN"] == "<redacted>"
    system = copied._storage.get_study_system_attrs(copied._study_id)
    assert system["autotune:worker:host-a/sim"] == WORKER
    assert system["autotune:claim:abc"] == 3
    assert copied.user_attrs["reference_output"].startswith("The sky")
    # The copy is a working study: the tuner's next ask gets the retry.
    resumed = copied.ask()
    assert resumed.number == 6 and resumed.user_attrs == {"retry_of": 5}


def test_edge_values_and_a_target_holding_other_studies(source: Path, tmp_path: Path) -> None:
    target = tmp_path / "target.db"
    build_study(sqlite_url(target), name="other")
    report = migrate_study(
        source_url=sqlite_url(source), target_url=sqlite_url(target), study_name="edges"
    )
    assert report.trials == {"COMPLETE": 3, "PRUNED": 1}
    assert_same(sqlite_url(source), sqlite_url(target), "edges")
    copied = open_study(sqlite_url(target), "edges")
    assert copied.directions == [StudyDirection.MAXIMIZE, StudyDirection.MINIMIZE]
    assert copied.trials[0].values[0] == math.inf
    assert math.isnan(copied.trials[0].intermediate_values[1])
    assert copied.trials[2].constraints == {"c": 1.0}
    assert copied.trials[0].distributions["mode"] == CategoricalDistribution(
        [None, True, 2, 2.5, "x"]
    )
    assert copied.trials[0].distributions["frac"] == FloatDistribution(0.5, 0.95, step=0.05)
    assert len(open_study(sqlite_url(target), "other").trials) == 7  # untouched


def test_copy_study_fallback_preserves_the_same(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """optuna.copy_study (used when Optuna's RDB models are not importable) passes the same
    field-by-field check on this study: metric names, constraints, WAITING fixed_params."""
    monkeypatch.setattr(migrate, "_ROW_COPY", False)
    target = tmp_path / "target.db"
    report = migrate_study(
        source_url=sqlite_url(source), target_url=sqlite_url(target), study_name=NAME
    )
    assert report.method == "copy_study" and report.verified
    assert_same(sqlite_url(source), sqlite_url(target))


@pytest.fixture
def new_york() -> Iterator[None]:
    """Local time with a daylight-saving change (the process's TZ, restored after)."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "America/New_York"
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


def test_times_in_the_repeated_dst_hour_stay_exact(
    source: Path, tmp_path: Path, new_york: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Optuna stores naive UTC and shows local time; 01:30 on the night clocks go back is two
    stored values that read the same. copy_study writes the first back for both, an hour
    off: the stored-time check catches it; the row copy is exact."""
    with sqlite3.connect(source) as db:
        db.execute(
            "UPDATE trials SET datetime_start = '2024-11-03 06:30:00.000000', "
            "datetime_complete = '2024-11-03 06:45:00.000000' WHERE number = 3 AND study_id = "
            "(SELECT study_id FROM studies WHERE study_name = ?)",
            (NAME,),
        )
    target = tmp_path / "fallback.db"
    monkeypatch.setattr(migrate, "_ROW_COPY", False)
    with pytest.raises(StorageError, match=r"trial #3: stored \(UTC\) start/complete times"):
        migrate_study(source_url=sqlite_url(source), target_url=sqlite_url(target), study_name=NAME)
    assert not target.exists()  # a file the migration created is removed with the copy
    monkeypatch.setattr(migrate, "_ROW_COPY", True)
    migrate_study(source_url=sqlite_url(source), target_url=sqlite_url(target), study_name=NAME)
    with sqlite3.connect(target) as db:
        row = db.execute("SELECT datetime_start FROM trials WHERE number = 3").fetchone()
    assert row == ("2024-11-03 06:30:00.000000",)
    assert_same(sqlite_url(source), sqlite_url(target))


# --------------------------------------------------------------------------- refusals


def test_refuses_when_the_target_already_holds_the_study(source: Path, tmp_path: Path) -> None:
    target = tmp_path / "target.db"
    build_edge_study(sqlite_url(target), name=NAME)
    before = digest(target)
    with pytest.raises(StorageError, match="already holds a study named 'mig'.*nothing was"):
        migrate_study(source_url=sqlite_url(source), target_url=sqlite_url(target), study_name=NAME)
    assert digest(target) == before
    with pytest.raises(StorageError, match="same storage"):
        migrate_study(source_url=sqlite_url(source), target_url=sqlite_url(source), study_name=NAME)


def test_refuses_a_study_with_running_trials(source: Path, tmp_path: Path) -> None:
    storage = open_storage(sqlite_url(source), create=False)
    study = optuna.load_study(study_name=NAME, storage=storage)
    for _ in range(2):  # the WAITING retry is taken first, then a new trial
        trial = study.ask()
        storage.set_trial_system_attr(trial._trial_id, "autotune:worker", "host-b/sim")
    storage.engine.dispose()  # type: ignore[attr-defined]
    before = digest(source)
    target = tmp_path / "target.db"
    with pytest.raises(StorageError) as info:
        migrate_study(source_url=sqlite_url(source), target_url=sqlite_url(target), study_name=NAME)
    text = str(info.value)
    assert "has 2 RUNNING trials (#6 on worker host-b/sim, #7 on worker host-b/sim)" in text
    assert "Stop them" in text and "let them finish" in text and "Nothing was copied" in text
    assert not target.exists()
    assert digest(source) == before


def test_study_selection(source: Path, tmp_path: Path) -> None:
    target = tmp_path / "target.db"
    with pytest.raises(StorageError, match=r"no study named 'nope'.*\(studies: edges, mig\)"):
        migrate_study(
            source_url=sqlite_url(source), target_url=sqlite_url(target), study_name="nope"
        )
    with pytest.raises(StorageError, match=r"holds 2 studies \(edges, mig\); choose one"):
        migrate_study(source_url=sqlite_url(source), target_url=sqlite_url(target), study_name=None)
    assert not target.exists()
    single = only(source, "edges", tmp_path)
    report = migrate_study(
        source_url=sqlite_url(single), target_url=sqlite_url(target), study_name=None
    )
    assert report.study_name == "edges"


def test_refuses_a_source_that_is_not_a_study_database(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE notes (body TEXT)")
    before = digest(other)
    with pytest.raises(StorageError, match="not an Optuna study database"):
        migrate_study(
            source_url=sqlite_url(other), target_url=sqlite_url(tmp_path / "t.db"), study_name=None
        )
    assert digest(other) == before  # Optuna's tables were not created in it
    with pytest.raises(StorageError, match="no study database at"):
        migrate_study(
            source_url=sqlite_url(tmp_path / "missing.db"),
            target_url=sqlite_url(tmp_path / "t.db"),
            study_name=None,
        )


# --------------------------------------------------------------------------- failures


def test_a_copy_that_does_not_verify_is_removed(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = migrate._copy_rows

    def lossy(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        with sqlite3.connect(target) as db:  # lose one attribute of trial 3
            db.execute(
                "DELETE FROM trial_user_attributes WHERE key = 'metrics' AND trial_id = "
                "(SELECT trial_id FROM trials JOIN studies USING (study_id) "
                "WHERE number = 3 AND study_name = ?)",
                (NAME,),
            )

    monkeypatch.setattr(migrate, "_copy_rows", lossy)
    target = tmp_path / "target.db"
    build_edge_study(sqlite_url(target), name="other")
    with pytest.raises(StorageError) as info:
        migrate_study(source_url=sqlite_url(source), target_url=sqlite_url(target), study_name=NAME)
    text = str(info.value)
    assert "not verified: the copy differs from the source" in text
    assert "trial #3: user_attrs differ (metrics)" in text
    assert "The copy was removed from the target" in text
    names = [s.study_name for s in open_storage(sqlite_url(target), create=False).get_all_studies()]
    assert names == ["other"]  # the other study stays, the file stays


def test_ctrl_c_during_the_copy_leaves_nothing(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(migrate, "PROGRESS_EVERY", 2)
    target = tmp_path / "target.db"
    build_edge_study(sqlite_url(target), name="other")

    def interrupt_at(text: str) -> Any:
        def progress(line: str) -> None:
            if line.startswith(text):
                raise KeyboardInterrupt

        return progress

    for at in ("copied 4/7", "verifying"):  # inside the transaction; after the commit
        with pytest.raises(KeyboardInterrupt):
            migrate_study(
                source_url=sqlite_url(source),
                target_url=sqlite_url(target),
                study_name=NAME,
                progress=interrupt_at(at),
            )
        storage = open_storage(sqlite_url(target), create=False)
        assert [s.study_name for s in storage.get_all_studies()] == ["other"]
        storage.engine.dispose()  # type: ignore[attr-defined]
    monkeypatch.setattr(migrate, "_ROW_COPY", False)  # copy_study: trials written one by one
    real = optuna.storages.RDBStorage._create_new_trial
    calls = []

    def interrupted(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(optuna.storages.RDBStorage, "_create_new_trial", interrupted)
    fresh = tmp_path / "fresh.db"
    with pytest.raises(KeyboardInterrupt):
        migrate_study(source_url=sqlite_url(source), target_url=sqlite_url(fresh), study_name=NAME)
    assert len(calls) == 3 and not fresh.exists()


# --------------------------------------------------------------------------- PostgreSQL


def test_sqlite_to_postgresql_and_back(source: Path, tmp_path: Path, pg_url: str) -> None:
    for name in (NAME, "edges"):
        report = migrate_study(source_url=sqlite_url(source), target_url=pg_url, study_name=name)
        assert report.verified and report.target.startswith("postgresql")
        assert_same(sqlite_url(source), pg_url, name)
    back = tmp_path / "back.db"
    for name in (NAME, "edges"):
        migrate_study(source_url=pg_url, target_url=sqlite_url(back), study_name=name)
        assert_same(sqlite_url(source), sqlite_url(back), name)
    with pytest.raises(StorageError, match="already holds a study named 'mig'"):
        migrate_study(source_url=sqlite_url(source), target_url=pg_url, study_name=NAME)


def test_postgresql_database_must_exist(source: Path, pg_url: str) -> None:
    missing = pg_url.rsplit("/", 1)[0] + "/no_such_db"
    with pytest.raises(StorageError, match='cannot open storage .*"no_such_db" does not exist'):
        migrate_study(source_url=sqlite_url(source), target_url=missing, study_name=NAME)


# --------------------------------------------------------------------------- command line


def _has_migrate_command() -> bool:
    from autotune import cli

    return any(
        (c.name or getattr(c.callback, "__name__", "")) == "migrate"
        for c in cli.app.registered_commands
    )


@pytest.mark.skipif(not _has_migrate_command(), reason="`autotune migrate` not wired in yet")
def test_cli_migrate(source: Path, tmp_path: Path) -> None:
    target = tmp_path / "target.db"
    args = ["migrate", "--from", sqlite_url(source), "--to", sqlite_url(target)]
    ambiguous = autotune_cli(*args, cwd=tmp_path, check=False)
    assert ambiguous.returncode == 2
    assert "holds 2 studies (edges, mig); choose one with --study NAME" in ambiguous.stderr
    done = autotune_cli(*args, "--study", NAME, cwd=tmp_path)
    assert "migrated study 'mig'" in done.stdout
    assert "7 trials (5 complete, 1 fail, 1 waiting)" in done.stdout
    assert "verifying the copy field by field" in done.stderr
    assert_same(sqlite_url(source), sqlite_url(target))
    again = autotune_cli(*args, "--study", NAME, "--quiet", cwd=tmp_path, check=False)
    assert again.returncode == 2 and again.stdout == ""
    assert (
        again.stderr.startswith("error: ") and "already holds a study named 'mig'" in again.stderr
    )


def test_the_report_counts_trials_by_record_version(tmp_path: Path) -> None:
    """Each trial carries the version of the record its writer used: none (1) before the
    typed record, SCHEMA_VERSION now; attributes that do not parse are counted, and copied
    as they are."""
    url = sqlite_url(tmp_path / "versions.db")
    study = optuna.create_study(study_name="v", storage=url, directions=OBJECTIVE.directions)
    for attrs in (
        TrialRecord(config={"x": 1}).to_attrs(),  # written now
        {"config": {"x": 2}, "failure": None},  # written before schema_version existed
        {"config": "not a mapping"},  # damaged
    ):
        trial = study.ask()
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        study.tell(trial, [1.0])
    report = migrate_study(
        source_url=url, target_url=sqlite_url(tmp_path / "copy.db"), study_name="v"
    )
    assert report.schema_versions == {"1": 1, str(SCHEMA_VERSION): 1, "unreadable": 1}
