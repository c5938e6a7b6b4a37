"""The default sampler honours a space's hints: the "all hints" trial first, then start-up
draws that take each hint with its strength, until the hints are refuted.

The toy surface: five four-way levers whose score adds up (one right value each, a neighbour
worth a little) and one flat integer lever, so the optimum is known and "all five hints
right" is the optimum itself.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

import optuna
import pytest

from autotune.space import SearchSpace, parse_space
from autotune.study.hints import ALL_HINTS_ATTR, Hints
from autotune.study.samplers import LocalTPESampler, make_sampler, unwrap

BEST = {"a": 3, "b": 1, "c": 2, "d": 0, "e": 3}
SEEDS = range(12)


def _space(hints: Mapping[str, tuple[object, float]]) -> SearchSpace:
    params: dict[str, Any] = {}
    for name in BEST:
        params[name] = {"type": "categorical", "choices": [0, 1, 2, 3], "target": {"env": name}}
        if name in hints:
            value, strength = hints[name]
            params[name]["hint"] = {"value": value, "strength": strength}
    params["n"] = {"type": "int", "low": 1, "high": 64, "target": {"env": "N"}}
    return parse_space(
        {
            "name": "toy",
            "services": ["s"],
            "engine": {"name": "generic"},
            "parameters": params,
            "baseline": {**dict.fromkeys(BEST, 0), "n": 1},
        },
        file="toy.yaml",
    )


def _score(config: dict[str, Any]) -> float:
    right = sum(
        1.0 if config[k] == v else 0.2 * (config[k] == (v + 1) % 4) for k, v in BEST.items()
    )
    return right * (1 - abs(int(config["n"]) - 40) / 1000)


OPTIMUM = _score({**BEST, "n": 40})


def _study(space: SearchSpace, seed: int) -> optuna.Study:
    sampler = make_sampler("tpe", seed=seed, hints=Hints.from_space(space))
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial(space.baseline_params(), user_attrs={"is_baseline": True})
    return study


def _trials_to_95(hints: Mapping[str, tuple[object, float]], seed: int, budget: int = 60) -> int:
    space = _space(hints)
    study = _study(space, seed)
    best = 0.0
    for i in range(budget):
        trial = study.ask()
        value = _score(space.suggest(trial))
        study.tell(trial, value)
        best = max(best, value)
        if best >= 0.95 * OPTIMUM:
            return i + 1
    return budget + 1


def test_strong_right_hints_find_the_optimum_within_a_few_trials() -> None:
    hints = {k: (v, 0.9) for k, v in BEST.items()}
    found = [_trials_to_95(hints, seed) for seed in SEEDS]
    assert max(found) <= 3, found  # the baseline, then the "all hints" trial
    without = [_trials_to_95({}, seed) for seed in SEEDS]
    assert statistics.median(without) > 10, without


@pytest.mark.parametrize(
    "wrong",
    [
        {"a": (1, 0.9)},
        {"a": (1, 1.0), "b": (3, 1.0)},
    ],
    ids=["one at 0.9", "two at 1.0"],
)
def test_a_wrong_hint_costs_at_most_a_couple_of_trials(wrong: dict[str, tuple[int, float]]) -> None:
    without = statistics.median(_trials_to_95({}, seed) for seed in SEEDS)
    misled = statistics.median(_trials_to_95(wrong, seed) for seed in SEEDS)
    assert misled <= without + 2, (misled, without)


def test_start_up_trials_take_a_kept_hint_with_its_strength() -> None:
    """A hint that beat the baseline keeps being drawn: about S of the start-up trials."""
    space = _space({"a": (3, 0.75)})
    taken = drawn = 0
    for seed in range(6):
        study = _study(space, seed)
        for _ in range(10):  # baseline, "all hints", 8 start-up draws
            trial = study.ask()
            config = space.suggest(trial)
            study.tell(trial, _score(config))
            if trial.number >= 2:
                drawn += 1
                taken += config["a"] == 3
        first = study.trials[1]
        assert first.system_attrs[ALL_HINTS_ATTR] is True
        assert first.params == {**space.baseline_params(), "a": 3}
        assert sum(ALL_HINTS_ATTR in t.system_attrs for t in study.trials) == 1
    share = taken / drawn
    assert 0.6 <= share <= 0.95, share  # 0.75, and a quarter of the prior's draws land on 3


def test_a_refuted_hint_is_no_longer_drawn() -> None:
    """The "all hints" trial did worse than the baseline: the rest of the start-up draws
    come from the prior alone (the hinted value about a quarter of the time)."""
    space = _space({"a": (1, 1.0)})  # a=1 scores 0, the baseline's a=0 scores 0.2
    taken = drawn = 0
    for seed in range(6):
        study = _study(space, seed)
        for _ in range(10):
            trial = study.ask()
            config = space.suggest(trial)
            study.tell(trial, _score(config))
            if trial.number >= 2:
                drawn += 1
                taken += config["a"] == 1
    assert taken / drawn < 0.45, taken / drawn


def test_no_all_hints_trial_when_the_hints_are_the_baseline() -> None:
    space = _space({"a": (0, 1.0)})  # the baseline's own value
    study = _study(space, 1)
    for _ in range(4):
        trial = study.ask()
        study.tell(trial, _score(space.suggest(trial)))
    assert not any(ALL_HINTS_ATTR in t.system_attrs for t in study.trials)


def test_only_the_default_sampler_takes_hints() -> None:
    hints = Hints.from_space(_space({"a": (3, 1.0)}))
    assert hints is not None
    assert isinstance(unwrap(make_sampler("tpe", seed=1, hints=hints)), LocalTPESampler)
    assert isinstance(
        unwrap(make_sampler("random", seed=1, hints=hints)), optuna.samplers.RandomSampler
    )
    assert Hints.from_space(_space({})) is None
