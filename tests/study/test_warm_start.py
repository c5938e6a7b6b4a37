"""Warm start: a new study starts from an earlier one's best configurations and failed
launches, translated to its space; the carried launches teach the sampler and are counted
nowhere; a study is warm-started once; a missing earlier study is an error before anything
runs. The last test runs ``autotune run`` twice (and a resume) on the simulated deployment."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from e2e_helpers import E2E_STUDY, FAST_CONFIG, REPO, autotune_cli, load
from optuna.trial import TrialState

from autotune.errors import ConfigError, StorageError
from autotune.failures import OF_THE_CONFIG, Failure
from autotune.results import (
    WARM_START_ATTR,
    best_estimate,
    config_estimates,
    feasible,
    load_results,
    own_trials,
)
from autotune.space import SearchSpace, load_space, parse_space
from autotune.study.definition import SLOSettings, WarmStartSettings, load_study_definition
from autotune.study.objectives import Objective
from autotune.study.record import finish_trial
from autotune.study.runner import Tuner
from autotune.study.samplers import MOVE_ATTR, _failure_signatures, _finished, make_sampler
from autotune.study.status import study_status
from autotune.study.warm_start import WARM_START_STUDY_ATTR, apply_warm_start, plan_warm_start
from autotune.trial import TrialOutcome, TrialRecord, failed

BUNDLED = REPO / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml"
OBJECTIVE = Objective(kind="throughput", slo=SLOSettings())


def _space(
    baseline_changes: dict[str, Any] | None = None,
    rules: list[dict[str, str]] | None = None,
    **changes: Any,
) -> SearchSpace:
    """A small space; ``changes`` replace parameters by name (None removes one)."""
    params: dict[str, Any] = {
        "kernel": {"type": "categorical", "choices": ["a", "b", "c"], "target": {"env": "K"}},
        "batch": {"type": "int", "low": 8, "high": 256, "step": 8, "target": {"env": "B"}},
        "spec": {"type": "categorical", "choices": ["off", "eagle"], "target": {"env": "S"}},
        "steps": {
            "type": "int",
            "low": 1,
            "high": 4,
            "when": "spec == 'eagle'",
            "target": {"env": "N"},
        },
        "graphs": {"type": "bool", "target": {"env": "G"}},
    }
    baseline: dict[str, Any] = {"kernel": "a", "batch": 64, "spec": "off", "graphs": False}
    baseline.update(baseline_changes or {})
    for name, value in changes.items():
        if value is None:
            params.pop(name)
            baseline.pop(name, None)
        else:
            params[name] = value
    rules = rules or [
        {"name": "c_no_graphs", "when": "kernel == 'c' and graphs", "reason": "illustrative"}
    ]
    return parse_space(
        {
            "name": "ws",
            "services": ["s"],
            "engine": {"name": "generic"},
            "parameters": params,
            "forbidden": rules if {"kernel", "graphs"} <= set(params) else [],
            "baseline": baseline,
        },
        file="ws.yaml",
    )


def _record(
    study: optuna.Study,
    space: SearchSpace,
    params: dict[str, Any],
    *,
    value: float | None = None,
    failure: str | None = None,
    baseline: bool = False,
) -> None:
    """One trial stored the way the runner stores it (``finish_trial``)."""
    study.enqueue_trial(params, user_attrs={"is_baseline": True} if baseline else None)
    trial = study.ask()
    config = space.suggest(trial)
    record = TrialRecord(config=config, is_baseline=baseline, deployment="sim")
    if failure is not None:
        outcome = failed(OBJECTIVE, record, failure=failure, reason=f"it {failure}")
    else:
        assert value is not None
        metrics = {"output_throughput": value, "error_rate": 0.0}
        record.metrics = metrics
        outcome = TrialOutcome(
            values=OBJECTIVE.values(metrics),
            constraints=OBJECTIVE.constraints(metrics),
            record=record,
        )
    finish_trial(study, trial, outcome, constraint_keys=OBJECTIVE.constraint_keys)


def _source(space: SearchSpace) -> optuna.Study:
    """An earlier study: its baseline, four measured configurations, three OOMs at
    batch=256, a wrong output, a crash with graphs on, a forbidden proposal and an
    interrupted trial."""
    study = optuna.create_study(study_name="old", directions=OBJECTIVE.directions)
    base = space.baseline_params()
    _record(study, space, base, value=100.0, baseline=True)
    _record(study, space, {**base, "kernel": "b", "batch": 128}, value=300.0)
    _record(study, space, {**base, "kernel": "b", "batch": 96}, value=250.0)
    _record(study, space, {**base, "spec": "eagle", "steps": 4}, value=200.0)  # steps 4
    _record(study, space, {**base, "graphs": True}, value=150.0)
    _record(study, space, {**base, "batch": 256, "graphs": True}, failure="cuda_oom")
    _record(study, space, {**base, "batch": 256, "kernel": "b"}, failure="cuda_oom")
    _record(study, space, {**base, "spec": "eagle", "steps": 4, "batch": 256}, failure="cuda_oom")
    _record(study, space, {**base, "kernel": "c"}, failure="wrong_output")
    _record(study, space, {**base, "graphs": True, "spec": "eagle", "steps": 2}, failure="crashed")
    _record(study, space, {**base, "kernel": "c", "graphs": True}, failure="forbidden")
    trial = study.ask({"kernel": space.distributions()["kernel"]})
    study.tell(trial, state=TrialState.FAIL)
    return study


# --------------------------------------------------------------------------- translation


def test_translation_drops_renames_replaces_and_fixes_conditions() -> None:
    old = {"kernel": "b", "batch": 300, "spec": "eagle", "steps": 3, "graphs": True, "old": 1}
    new = _space(
        {"cuda_graphs": False},
        batch={"type": "int", "low": 8, "high": 128, "step": 8, "target": {"env": "B"}},
        graphs=None,  # renamed: graphs -> cuda_graphs
        cuda_graphs={"type": "bool", "target": {"env": "CG"}},
        steps={
            "type": "int",
            "low": 1,
            "high": 2,
            "when": "spec == 'eagle'",
            "target": {"env": "N"},
        },
    )
    moved = new.translate(old)
    assert moved.dropped == {"graphs": True, "old": 1}
    assert moved.replaced == {"batch": (300, 64), "steps": (3, 2)}  # baseline's; nearest
    assert moved.filled == {"cuda_graphs": False}
    assert moved.params == {
        "kernel": "b",
        "batch": 64,
        "spec": "eagle",
        "steps": 2,
        "cuda_graphs": False,
    }
    notes = moved.notes()
    assert (
        "'graphs' is gone (was True)" in notes and "'cuda_graphs' was not set: False taken" in notes
    )
    assert "'batch'=300 is no longer allowed: 64 taken" in notes


def test_translation_leaves_out_what_a_changed_condition_switches_off() -> None:
    new = _space(
        steps={"type": "int", "low": 1, "high": 4, "when": "kernel == 'b'", "target": {"env": "N"}}
    )
    moved = new.translate(
        {"kernel": "a", "batch": 64, "spec": "eagle", "steps": 3, "graphs": False}
    )
    assert moved.inactive == {"steps": 3} and "steps" not in moved.params
    switched_on = new.translate({"kernel": "b", "batch": 64, "spec": "off", "graphs": False})
    assert switched_on.filled == {"steps": 1}  # no baseline value, no hint: the low end
    assert new.translate({"kernel": "c", "batch": 64, "spec": "off", "graphs": True}).violations


# --------------------------------------------------------------------------- plan and carry


def test_the_best_configurations_come_first_translated_and_forbidden_ones_skipped() -> None:
    space = _space()
    source = _source(space)
    new = _space(
        steps={
            "type": "int",
            "low": 1,
            "high": 3,
            "when": "spec == 'eagle'",
            "target": {"env": "N"},
        }
    )
    plan = plan_warm_start(source, space=new, top=3, enqueued=[new.baseline_params()])
    # ranked like `autotune best`: 300 (#1), 250 (#2), 200 (#3, steps 4 -> 3 here), 150
    assert [e.origin for e in plan.enqueue] == ["old#1", "old#2", "old#3"]
    assert plan.enqueue[2].params["steps"] == 3
    assert any("old#3" in m and "'steps'=4 is no longer allowed" in m for m in plan.messages)
    everything = plan_warm_start(source, space=new, top=10, enqueued=[new.baseline_params()])
    assert [e.origin for e in everything.enqueue] == ["old#1", "old#2", "old#3", "old#4"]
    assert any("old#0" in m and "same as the baseline" in m for m in everything.messages)
    # a configuration that the new space forbids is not enqueued
    forbids = _space(rules=[{"name": "no_b", "when": "kernel == 'b'", "reason": "b is gone"}])
    skipped = plan_warm_start(source, space=forbids, top=2)
    assert [e.origin for e in skipped.enqueue] == ["old#3", "old#4"]
    assert any("old#1 skipped" in m and "no_b" in m for m in skipped.messages)


def test_failed_launches_are_carried_uncounted_and_teach_the_sampler() -> None:
    space = _space()
    source = _source(space)
    plan = plan_warm_start(source, space=space, top=2, enqueued=[space.baseline_params()])
    assert [c.origin for c in plan.carried] == ["old#5", "old#6", "old#7", "old#8", "old#9"]
    assert {c.failure for c in plan.carried} <= {f.value for f in OF_THE_CONFIG}

    study = optuna.create_study(directions=OBJECTIVE.directions)
    study.enqueue_trial(space.baseline_params(), user_attrs={"is_baseline": True})
    apply_warm_start(study, plan, space=space, objective=OBJECTIVE)
    trials = study.get_trials()
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    assert [t.system_attrs["fixed_params"] for t in waiting] == [space.baseline_params()] + [
        e.params for e in plan.enqueue
    ]
    carried = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(carried) == 5
    for t in carried:
        assert t.user_attrs[WARM_START_ATTR].startswith("old#")
        assert not feasible(t) and t.values == [0.0]
        assert t.constraints["feasible"] == 1.0  # the runner's constraints of a failed launch
        assert t.system_attrs["constraints"] == [1.0] * len(OBJECTIVE.constraint_keys)
        record = TrialRecord.from_attrs(t.user_attrs)
        assert record.warm_start_from == t.user_attrs[WARM_START_ATTR]
        assert record.failure in ("cuda_oom", "wrong_output", "crashed") and record.config
    assert study.user_attrs[WARM_START_STUDY_ATTR]["carried"] == 5

    # counted nowhere: own trials, results, estimates, best, status
    assert own_trials(study, states=(TrialState.COMPLETE,)) == []
    assert [r.state for r in load_results(study)] == ["WAITING"] * len(waiting)
    assert config_estimates(study) == []
    assert best_estimate(study) is None
    status = study_status(study)
    assert status.trials == len(waiting) and status.states["COMPLETE"] == 0
    assert status.infeasible == 0 and status.carried == 5 and status.carried_from == ["old"]

    # ... but the sampler learns from them: the OOMs share batch=256
    finished = _finished(study)
    failed_numbers = {t.number for t in finished if not feasible(t)}
    signatures = _failure_signatures(finished, failed_numbers)
    assert ({"batch": 256}, []) in signatures, signatures


def test_carried_trials_do_not_shorten_the_start_up() -> None:
    """Sixteen carried OOMs are evidence, not exploration: the next trials are still the
    sampler's start-up ones, not local moves around the one measured trial."""
    space = _space()
    source = optuna.create_study(study_name="old", directions=OBJECTIVE.directions)
    base = space.baseline_params()
    _record(source, space, base, value=100.0, baseline=True)
    for batch in range(136, 257, 8):
        _record(source, space, {**base, "batch": batch, "graphs": True}, failure="cuda_oom")
    plan = plan_warm_start(source, space=space, top=0)
    assert len(plan.carried) == 16
    study = optuna.create_study(
        directions=OBJECTIVE.directions, sampler=make_sampler("tpe", seed=3)
    )
    apply_warm_start(study, plan, space=space, objective=OBJECTIVE)
    _record(study, space, base, value=100.0, baseline=True)
    for _ in range(6):
        trial = study.ask()
        space.suggest(trial)
        assert MOVE_ATTR not in study.trials[trial.number].system_attrs  # no local move yet
        study.tell(trial, [50.0])
    assert len(own_trials(study)) == 7


def test_a_crash_whose_values_are_gone_is_not_carried() -> None:
    space = _space()
    source = _source(space)
    # batch now stops at 128: the OOMs at 256 would teach a wrong lesson; graphs is gone:
    # old#9 crashed with graphs=True (not the baseline's), old#8 had the baseline's False
    new = _space(
        batch={"type": "int", "low": 8, "high": 128, "step": 8, "target": {"env": "B"}},
        graphs=None,
    )
    plan = plan_warm_start(source, space=new, top=0)
    assert [c.origin for c in plan.carried] == ["old#8"]
    assert "graphs" not in plan.carried[0].params
    assert any("not carried: 4" in m for m in plan.messages), plan.messages


# --------------------------------------------------------------------------- the runner


def _definition(tmp_path: Path) -> Any:
    data = yaml.safe_load(E2E_STUDY.read_text())
    data["space"] = str(BUNDLED)
    data["deployment"] = str(REPO / "launchers" / "sim-dsv4-flash-pd.yaml")
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_study_definition(path)


def test_a_missing_earlier_study_stops_before_anything_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    definition = _definition(tmp_path)
    url = f"sqlite:///{tmp_path}/new.db"
    for settings, words in (
        (WarmStartSettings(study="gone"), "no study database"),
        (WarmStartSettings(study="gone", storage=f"sqlite:///{tmp_path}/none.db"), "none.db"),
    ):
        with pytest.raises(StorageError) as info:
            Tuner(definition=definition, study_name="new", storage_url=url, warm_start=settings)
        assert "cannot warm-start from study 'gone'" in str(info.value) and words in str(info.value)
    assert not (tmp_path / "new.db").exists() and not (tmp_path / "none.db").exists()
    other = f"sqlite:///{tmp_path}/other.db"
    optuna.create_study(study_name="there", storage=other)
    with pytest.raises(StorageError, match="no study named 'gone' in this storage .studies: there"):
        Tuner(
            definition=definition,
            study_name="new",
            storage_url=url,
            warm_start=WarmStartSettings(study="gone", storage=other),
        )
    with pytest.raises(ConfigError, match="cannot warm-start from itself"):
        Tuner(
            definition=definition,
            study_name="there",
            storage_url=other,
            warm_start=WarmStartSettings(study="there"),
        )
    assert not (tmp_path / "new.db").exists()


def test_the_study_file_and_the_options_name_the_earlier_study(tmp_path: Path) -> None:
    from autotune.cli._run import _warm_start

    data = yaml.safe_load(E2E_STUDY.read_text())
    data["space"] = str(BUNDLED)
    data["deployment"] = str(REPO / "launchers" / "sim-dsv4-flash-pd.yaml")
    data["warm_start"] = {"study": "last-week", "top": 3, "storage": "sqlite:///x.db"}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    definition = load_study_definition(path)
    assert _warm_start(definition, None, None, None) == WarmStartSettings(
        study="last-week", storage="sqlite:///x.db", top=3
    )
    other = _warm_start(definition, "older", None, "sqlite:///shared.db")
    assert other == WarmStartSettings(study="older", storage="sqlite:///shared.db", top=3)
    plain = load_study_definition(E2E_STUDY)
    assert _warm_start(plain, None, None, None) is None
    assert _warm_start(plain, "a", None, None) == WarmStartSettings(
        study="a", storage="sqlite:///studies/a.db", top=5
    )
    with pytest.raises(ConfigError, match="--warm-start-storage needs --warm-start-from"):
        _warm_start(plain, None, "sqlite:///y.db", None)
    data["warm_start"] = {"study": "x", "top": -1}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="warm_start.top"):
        load_study_definition(path)


@pytest.mark.slow
def test_autotune_run_warm_started_from_an_earlier_study(tmp_path: Path) -> None:
    """Study a: baseline, a fast configuration, one that serves wrong text, one that runs out
    of memory. Study b, over a space without ``pytorch_alloc_conf`` and with
    ``mem_fraction_static`` capped at 0.90: a's fast configuration comes right after the
    baseline (translated), the wrong output is carried (its dropped lever had the baseline's
    value), the OOM at 0.95 is not (its value is gone); then a resume warm-starts nothing."""
    space = load_space(BUNDLED)
    fast = {k: v for k, v in FAST_CONFIG.items() if k in {p.name for p in space.sampled_params}}
    wrong = {**fast, "nccl_proto": "LL128", "pcie_ipc_allreduce": False}
    oom = {
        **fast,
        "speculative": "eagle",
        "speculative_num_steps": 4,
        "mem_fraction_static": 0.95,
        "cuda_graph_max_bs_decode": 256,
    }
    base = yaml.safe_load(E2E_STUDY.read_text())
    base["deployment"] = str(REPO / "launchers" / "sim-dsv4-flash-pd.yaml")
    base["remeasure"] = {"top_k": 0}
    a_file, b_file = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a_file.write_text(
        yaml.safe_dump({**base, "space": str(BUNDLED), "enqueue": [fast, wrong, oom]})
    )
    child = tmp_path / "space-b.yaml"
    child.write_text(
        yaml.safe_dump(
            {
                "extends": str(BUNDLED),
                "parameters": {
                    "pytorch_alloc_conf": None,
                    "mem_fraction_static": {
                        "type": "float",
                        "low": 0.7,
                        "high": 0.9,
                        "step": 0.01,
                        "target": {"flag": "--mem-fraction-static"},
                    },
                },
            }
        )
    )
    b_file.write_text(yaml.safe_dump({**base, "space": str(child)}))
    db = tmp_path / "s.db"
    storage = ["--storage", f"sqlite:///{db}"]
    autotune_cli(
        "run",
        "--trials",
        "4",
        "--seed",
        "1",
        "--study",
        "a",
        *storage,
        "--study-file",
        str(a_file),
        cwd=tmp_path,
    )
    a = load("a", db).get_trials()
    assert [t.user_attrs["failure"] for t in a] == [None, None, "wrong_output", "cuda_oom"]

    b_run = ["run", "--study", "b", *storage, "--study-file", str(b_file), "--warm-start-from", "a"]
    first = autotune_cli(*b_run, "--trials", "3", "--seed", "2", cwd=tmp_path)
    out = first.stdout
    assert (
        "warm start: a#1 (" in out and "enqueued, translated: 'pytorch_alloc_conf' is gone" in out
    )
    assert "warm start: a#0 (" in out and "same as the baseline" in out
    assert "1 failed launches of a carried as evidence (1 wrong_output)" in out
    assert "not carried: 1 (a value it needs is gone" in out
    b_space = load_space(child)
    trials = load("b", db).get_trials()
    assert trials[0].user_attrs["is_baseline"] and trials[0].params == b_space.baseline_params()
    assert trials[1].params == b_space.translate(a[1].params).params
    carried = [t for t in trials if t.user_attrs.get(WARM_START_ATTR)]
    assert [t.user_attrs[WARM_START_ATTR] for t in carried] == ["a#2"]
    assert carried[0].number == 2 and carried[0].state == TrialState.COMPLETE
    own = [t for t in trials if not t.user_attrs.get(WARM_START_ATTR)]
    assert len(own) == 3 and all(t.state == TrialState.COMPLETE for t in own)
    assert "study holds 3" in out

    again = autotune_cli(*b_run, "--trials", "4", "--seed", "2", cwd=tmp_path)
    assert "warm-started from 'a' when it began (1 configurations enqueued, 1 failed launches" in (
        again.stdout
    )
    assert "warm start: a#" not in again.stdout and "study holds 4" in again.stdout
    trials = load("b", db).get_trials()
    assert sum(1 for t in trials if t.user_attrs.get(WARM_START_ATTR)) == 1
    assert len(own_trials(load("b", db))) == 4

    status = autotune_cli("status", "--study", "b", *storage, "--json", cwd=tmp_path)
    shown = json.loads(status.stdout)
    assert shown["trials"] == 4 and shown["carried"] == 1 and shown["carried_from"] == ["a"]
    assert shown["states"]["COMPLETE"] == 4 and shown["infeasible"] == sum(
        1 for t in own_trials(load("b", db)) if t.user_attrs.get("failure")
    )
    best = autotune_cli("best", "--study", "b", *storage, cwd=tmp_path)
    assert f"trial #{carried[0].number}" not in best.stdout
    assert all(r.number != carried[0].number for r in load_results(load("b", db)))
    missing = autotune_cli(
        "run", "--study", "c", *storage, "--study-file", str(b_file), "--warm-start-from", "zz",
        "--trials", "1", cwd=tmp_path, check=False,
    )  # fmt: skip
    assert missing.returncode == 2 and "no study named 'zz'" in missing.stderr
    assert "c" not in optuna.get_all_study_names(f"sqlite:///{db}")
    assert Failure.wrong_output in OF_THE_CONFIG
