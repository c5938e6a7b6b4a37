"""Sampling through real in-memory Optuna studies (TPE group=True, GridSampler, FixedTrial)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import optuna
import pytest
from space_fixtures import BUNDLED, small, write

from autotune.space import SearchSpace, load_space

CONDITIONAL = {
    "nccl_min_nchannels": "nccl_channels",
    "nccl_max_nchannels": "nccl_channels",
    "speculative_num_steps": "speculative",
    "prefill_speculative": "speculative",
    "cuda_graph_bs_decode": "cuda_graph_backend_decode",
}


@pytest.fixture(scope="module")
def space() -> SearchSpace:
    return load_space(BUNDLED)


@pytest.fixture(autouse=True)
def _quiet_optuna() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def _active(config: Mapping[str, object], name: str) -> bool:
    gate = CONDITIONAL[name]
    if gate == "speculative":
        return config[gate] == "eagle"
    if gate == "cuda_graph_backend_decode":
        return config[gate] != "disabled"
    return config[gate] is True


def test_tpe_study_50_trials(space: SearchSpace) -> None:
    sampler = optuna.samplers.TPESampler(seed=3, group=True, multivariate=True, n_startup_trials=10)
    study = optuna.create_study(sampler=sampler, direction="maximize")
    study.enqueue_trial(space.baseline_params(), user_attrs={"is_baseline": True})
    distributions = space.distributions()
    keys: set[str] = set()
    states = {"steps": set(), "channels": set()}  # type: dict[str, set[object]]
    for number in range(50):
        trial = study.ask()
        config = space.suggest(trial)
        if number == 0:
            assert config == space.baseline_config()
            assert trial.params == space.baseline_params()
        # Only active parameters were suggested, with the declared distributions.
        sampled = {k: v for k, v in config.items() if space.parameter(k).sampled}
        assert trial.params.keys() == sampled.keys()
        for name, value in trial.params.items():
            assert value == pytest.approx(sampled[name]), name  # floats rounded to their step
        for name, dist in trial.distributions.items():
            assert dist == distributions[name], name
        for name in CONDITIONAL:
            assert (name in config) == _active(config, name), (name, config)
        if config["speculative"] == "eagle":
            steps = config["speculative_num_steps"]
            assert isinstance(steps, int)
            assert config["speculative_num_draft_tokens"] == steps + 1
            states["steps"].add(steps)
        else:
            assert "speculative_num_draft_tokens" not in config
        states["channels"].add(config["nccl_channels"])
        assert list(config) == [p.name for p in space.params if p.name in config]
        assert space.complete(trial.params) == config
        keys.add(space.config_key(config))
        violations = space.violations(config)
        score = 0.0 if violations else float(config["mem_fraction_static"])  # type: ignore[arg-type]
        study.tell(trial, score)
    assert states["channels"] == {False, True}
    assert len(states["steps"]) >= 2
    assert len(keys) >= 40  # mostly distinct proposals
    assert study.trials[0].user_attrs["is_baseline"] is True


def test_fixed_trial_and_baseline_round_trip(space: SearchSpace) -> None:
    fixed = optuna.trial.FixedTrial(space.baseline_params())
    assert space.suggest(fixed) == space.baseline_config()
    stored = optuna.create_study()
    stored.enqueue_trial(space.baseline_params())
    trial = stored.ask()
    config = space.suggest(trial)
    stored.tell(trial, 1.0)
    again = stored.trials[0]
    assert space.complete(again.params) == config == space.baseline_config()
    assert space.config_key(again.params) == space.config_key(space.baseline_config())


def test_grid_sampler_on_a_small_space(tmp_path) -> None:  # type: ignore[no-untyped-def]
    space = load_space(write(tmp_path / "small.yaml", small()))
    grid = space.grid()
    assert grid["spec"] == ["off", "eagle"]
    assert grid["nmin"] == [1, 6, 32]  # geometric levels of a log int
    assert grid["mem"] == [0.7, 0.82, 0.88, 0.95]
    sampler = optuna.samplers.GridSampler(grid, seed=0)
    study = optuna.create_study(sampler=sampler)
    keys = set()
    for _ in range(40):
        trial = study.ask()
        config = space.suggest(trial)
        keys.add(space.config_key(config))
        assert set(trial.params) <= set(grid)
        for name, value in trial.params.items():
            assert value in grid[name]
        study.tell(trial, 0.0)
    assert len(keys) > 5


def test_random_sampler_respects_conditions_and_steps(space: SearchSpace) -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=11))
    for _ in range(60):
        trial = study.ask()
        config = space.suggest(trial)
        mem = config["mem_fraction_static"]
        assert isinstance(mem, float) and round(mem, 2) == mem
        assert config["chunked_prefill_size"] % 1024 == 0  # type: ignore[operator]
        for name in CONDITIONAL:
            assert (name in config) == _active(config, name)
        study.tell(trial, 0.0)
