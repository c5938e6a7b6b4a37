"""The optional samplers (``gp``, ``catcma``, ``rfbo``; autotune/study/extra_samplers.py):
each runs the tuning loop on a small conditional space with a forbidden rule and a crash
region, proposes only valid values, repeats itself with a seed and improves on its random
start-up; a missing package names the extra to install.

They need their extras (``make test`` installs them through ``.[dev]``); without one its
tests skip, and fail under ``AUTOTUNE_REQUIRE_ENGINES=1`` (set by ``make test``).
"""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
from sampler_helpers import load_harness, quiet_optuna  # noqa: F401

from autotune.errors import ConfigError
from autotune.space import SearchSpace
from autotune.space.loader import parse_space
from autotune.study import _extra_common, extra_samplers
from autotune.study.definition import SLOSettings
from autotune.study.objectives import Objective
from autotune.study.record import finish_trial
from autotune.study.samplers import make_sampler, unwrap
from autotune.trial import TrialOutcome, TrialRecord, failed

REPO = Path(__file__).resolve().parents[2]
NAMES = extra_samplers.EXTRA_SAMPLERS

SPACE: dict[str, Any] = {
    "name": "toy",
    "services": ["server"],
    "engine": {"name": "generic"},
    "parameters": {
        "kernel": {"type": "categorical", "choices": ["a", "b", "c"], "target": {"env": "K"}},
        "fast_path": {"type": "bool", "target": {"switch": "--fast", "present_when": True}},
        "depth": {
            "type": "int",
            "low": 1,
            "high": 6,
            "when": "fast_path",
            "target": {"flag": "--depth"},
        },
        "batch": {"type": "int", "low": 1, "high": 128, "log": True, "target": {"flag": "--bs"}},
        "fraction": {"type": "float", "low": 0.5, "high": 0.95, "target": {"flag": "--mem"}},
    },
    "forbidden": [
        {
            "name": "c_needs_fast_path",
            "when": "kernel == 'c' and not fast_path",
            "reason": "kernel c exists only on the fast path",
        }
    ],
    "baseline": {"kernel": "a", "fast_path": False, "batch": 4, "fraction": 0.6},
}


def _score(config: dict[str, Any]) -> float | None:
    """Throughput of a configuration; None: out of memory (a large batch near full memory)."""
    if config["fraction"] > 0.9 and config["batch"] >= 64:
        return None
    speed = {"a": 1.0, "b": 1.3, "c": 1.15}[config["kernel"]]
    if config["fast_path"]:
        speed *= 1.0 + 0.1 * (1.0 - ((config["depth"] - 4) / 3) ** 2)
    batch = math.exp(-(((math.log2(config["batch"]) - math.log2(48)) / 1.2) ** 2))
    memory = math.exp(-(((config["fraction"] - 0.85) / 0.1) ** 2))
    return 100.0 * speed * (0.3 + 0.7 * batch) * (0.4 + 0.6 * memory)


def _required() -> bool:
    return os.environ.get("AUTOTUNE_REQUIRE_ENGINES", "").strip().lower() not in (
        "",
        "0",
        "false",
        "no",
    )


def _needs(name: str) -> None:
    """Skip when the sampler's extra is not installed (fail when ``make test`` requires it)."""
    try:
        extra_samplers._require(name)
    except ConfigError as exc:
        if _required():
            pytest.fail(f"AUTOTUNE_REQUIRE_ENGINES is set: {exc}")
        pytest.skip(str(exc))


pytestmark = pytest.mark.usefixtures("quiet_optuna")


@pytest.fixture(scope="module")
def space() -> SearchSpace:
    return parse_space(SPACE, file="toy.yaml")


def _tune(
    space: SearchSpace, name: str, seed: int, trials: int = 30
) -> tuple[optuna.Study, list[dict[str, Any]], list[float]]:
    """The runner's loop (autotune/study/runner.py, as benchmarks/sample_efficiency.run_one
    replays it): baseline enqueued first, forbidden configurations recorded infeasible
    without running, crashes with the runner's failed values, every trial stored by
    ``finish_trial``. Returns the study, the configurations and their true scores (0 for
    a forbidden or crashed one)."""
    objective = Objective(kind="throughput", slo=SLOSettings())
    sampler = make_sampler(name, seed=seed)
    study = optuna.create_study(directions=objective.directions, sampler=sampler)
    study.enqueue_trial(space.baseline_params(), user_attrs={"is_baseline": True})
    configs: list[dict[str, Any]] = []
    scores: list[float] = []
    for _ in range(trials):
        trial = study.ask()
        config = dict(space.suggest(trial))
        attrs: dict[str, Any] = {
            "config": config,
            "is_baseline": bool(trial.user_attrs.get("is_baseline", False)),
            "failure": None,
            "reason": None,
            "reused_from": None,
            "phase_seconds": {"restart": 0.0, "warmup": 0.0, "measure": 0.0},
        }
        record = TrialRecord.from_attrs(attrs)
        violations = space.violations(config)
        value = None if violations else _score(config)
        if violations:
            reason = "; ".join(f"{v.name}: {v.reason}" for v in violations)
            outcome = failed(objective, record, failure="forbidden", reason=reason)
        elif value is None:
            outcome = failed(objective, record, failure="oom", reason="CUDA out of memory")
        else:
            metrics = {"output_throughput": value, "tpot_ms": {}, "error_rate": 0.0}
            outcome = TrialOutcome(
                values=objective.values(metrics),
                constraints=objective.constraints(metrics),
                record=record,
            )
        finish_trial(study, trial, outcome, constraint_keys=objective.constraint_keys)
        configs.append(config)
        scores.append(value or 0.0)
    return study, configs, scores


SLOW_GP = [pytest.param(n, marks=pytest.mark.slow) if n == "gp" else n for n in NAMES]
"""gp takes one to three seconds per modelled trial on two cores."""


@pytest.mark.parametrize("name", SLOW_GP)
def test_a_run_proposes_valid_values_and_improves(space: SearchSpace, name: str) -> None:
    _needs(name)
    budget = 22 if name == "gp" else 30  # gp: seconds per modelled trial; 12 of them here
    study, configs, scores = _tune(space, name, seed=3, trials=budget)
    trials = study.trials
    assert len(trials) == budget
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert configs[0] == dict(space.baseline_config())
    for trial, config in zip(trials, configs, strict=True):
        # every value in its domain, every lever active exactly when its `when` holds
        assert dict(space.complete(trial.params)) == config
        assert ("depth" in trial.params) == trial.params["fast_path"]
    assert len({space.config_key(c) for c in configs}) >= 2 * budget // 3  # it does not stall
    # The model beats its random start-up, and its proposals are better on average (random
    # search's trials 11-30 average what its first 10 do, about 30 on this surface).
    assert max(scores[10:]) > max(scores[:10])
    assert statistics.mean(scores[10:]) > 1.5 * statistics.mean(scores[:10])


@pytest.mark.parametrize("name", SLOW_GP)
def test_a_seed_repeats_the_run(space: SearchSpace, name: str) -> None:
    _needs(name)
    trials = 12 if name == "gp" else 30  # gp: seconds per trial; 2 modelled ones suffice
    _, first, _ = _tune(space, name, seed=11, trials=trials)
    _, again, _ = _tune(space, name, seed=11, trials=trials)
    _, other, _ = _tune(space, name, seed=12, trials=trials)
    assert first == again
    assert first != other


def test_what_each_models_of_a_conditional_space(space: SearchSpace) -> None:
    """gp and catcma model the levers every trial has (``depth`` is random when the fast
    path is on); rfbo models ``depth`` too (imputed when off)."""
    for name in NAMES:
        _needs(name)
    study, _, _ = _tune(space, "random", seed=5, trials=15)
    trial = optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING)
    modelled = {
        name: set(make_sampler(name, seed=0).infer_relative_search_space(study, trial))
        for name in NAMES
    }
    assert modelled["gp"] == modelled["catcma"] == {"kernel", "fast_path", "batch", "fraction"}
    trial.number = 1  # not a random interleave (every RF_RANDOM_EVERY-th trial number)
    forest_space = make_sampler("rfbo", seed=0).infer_relative_search_space(study, trial)
    assert set(forest_space) == {"kernel", "fast_path", "batch", "fraction", "depth"}
    assert extra_samplers._gates(study.trials, forest_space) == {
        "depth": ("fast_path", frozenset({1}))  # the index of True
    }


def test_the_enqueued_baseline_is_told_not_sampled(space: SearchSpace) -> None:
    """CatCMA starts at the best start-up trial and tells generations as trials finish."""
    _needs("catcma")
    study, _, _ = _tune(space, "catcma", seed=3, trials=40)
    sampler = unwrap(study.sampler)
    assert isinstance(sampler, extra_samplers.CatCMASampler)
    assert sampler._state is not None and sampler._state.optimizer.generation >= 2
    baseline = optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING)
    baseline.system_attrs = {"fixed_params": space.baseline_params()}
    for name in NAMES:
        assert make_sampler(name, seed=0).infer_relative_search_space(study, baseline) == {}


def test_gp_sees_each_constraint_once(space: SearchSpace) -> None:
    """finish_trial writes the named constraints and the old list for optuna-dashboard;
    Optuna reads both, the GP view only the named ones."""
    study, _, _ = _tune(space, "random", seed=1, trials=3)
    trial = study.trials[0]
    assert set(trial.constraints) == {"0", "1", "feasible", "slo_error_rate"}
    assert set(extra_samplers._named_only(trial).constraints) == {"feasible", "slo_error_rate"}
    assert set(trial.constraints) == {"0", "1", "feasible", "slo_error_rate"}  # untouched


def test_several_objectives(space: SearchSpace) -> None:
    for name in ("catcma", "rfbo"):
        _needs(name)
        with pytest.raises(ConfigError, match="one objective"):
            make_sampler(name, seed=0, multi_objective=True)
    _needs("gp")
    sampler = make_sampler("gp", seed=0, multi_objective=True)
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    for _ in range(12):
        trial = study.ask()
        config = space.suggest(trial)
        score = _score(dict(config)) or 0.0
        trial.set_constraint("feasible", 0.0 if score else 1.0)
        study.tell(trial, [score, float(config["batch"])])  # what tell does with it
    assert len(study.best_trials) >= 1


@pytest.mark.parametrize(
    ("name", "module", "package"),
    [
        ("gp", "torch", "torch"),
        ("gp", "scipy", "scipy"),
        ("catcma", "cmaes", "cmaes"),
        ("rfbo", "sklearn.ensemble", "scikit-learn"),
    ],
)
def test_a_missing_package_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, name: str, module: str, package: str
) -> None:
    real = extra_samplers._import

    def without(wanted: str) -> Any:
        if wanted == module:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)
        return real(wanted)

    monkeypatch.setattr(_extra_common, "_import", without)  # where _require looks it up
    with pytest.raises(ConfigError) as caught:
        make_sampler(name, seed=0)
    text = str(caught.value)
    assert f"'{name}' sampler needs {package}" in text
    assert f"pip install 'autotune[{name}]'" in text
    assert caught.value.field == "--sampler"


def test_importing_autotune_loads_none_of_them() -> None:
    code = (
        "import sys\n"
        "import autotune.cli, autotune.study.runner, autotune.study.extra_samplers\n"
        "from autotune.study.samplers import make_sampler\n"
        "make_sampler('tpe', seed=0)\n"
        "print(sorted(m for m in ('torch', 'cmaes', 'sklearn') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
