"""Interaction screening: pairs of values that beat the main-effects model come first."""

from __future__ import annotations

import itertools
import math

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial

from autotune.study import samplers
from autotune.study.screening import pair_scores

CHOICES = {
    "a": CategoricalDistribution(["a0", "a1", "a2"]),
    "b": CategoricalDistribution(["b0", "b1", "b2", "b3"]),
    "c": CategoricalDistribution(["c0", "c1"]),
}
DISTS: dict[str, BaseDistribution] = {**CHOICES, "n": IntDistribution(1, 64, log=True)}


def _value(p: dict) -> float:
    """Main effects of a and n, nothing from b or c alone, x1.3 for a2 with b3 only."""
    main = {"a0": 1.0, "a1": 1.2, "a2": 0.9}[p["a"]] * (1 + math.log(p["n"]) / 10)
    return 100 * main * (1.3 if (p["a"], p["b"]) == ("a2", "b3") else 1.0)


def _observations(n: int, seed: int) -> list[tuple[dict, float]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        p = {k: d.choices[rng.integers(len(d.choices))] for k, d in CHOICES.items()}
        p["n"] = int(rng.integers(1, 65))
        out.append((p, _value(p) * math.exp(rng.normal(0, 0.02))))
    return out


def test_the_needle_pair_scores_highest() -> None:
    scores = pair_scores(_observations(40, seed=0), DISTS)
    best = max(scores, key=scores.__getitem__)
    assert best == ("a", "a2", "b", "b3"), (best, scores[best])
    assert scores[best] > 0.1  # about log(1.3) above the model
    # main effects are absorbed by the model: a1 (the best a alone) carries no pair credit
    assert all(abs(v) < 0.1 for k, v in scores.items() if "a2" not in k or "b3" not in k)


def test_too_few_trials_or_levers_give_no_scores() -> None:
    assert pair_scores(_observations(2, seed=1), DISTS) == {}
    only_one = {"a": DISTS["a"], "n": DISTS["n"]}
    obs = [({"a": p["a"], "n": p["n"]}, v) for p, v in _observations(20, seed=1)]
    assert pair_scores(obs, only_one) == {}


def test_local_moves_try_the_evidenced_pair_and_skip_pairs_without_evidence() -> None:
    study = optuna.create_study(direction="maximize")
    needle_trials = [
        ({"a": "a2", "b": "b3", "c": c, "n": n}, _value({"a": "a2", "b": "b3", "n": n}))
        for c, n in (("c0", 4), ("c1", 16))
    ]
    for p, v in _observations(30, seed=2) + needle_trials:
        study.add_trial(optuna.trial.create_trial(params=p, distributions=DISTS, value=v))
    trials = study.trials

    def value_of(t: FrozenTrial) -> float:
        assert t.value is not None  # every trial was added with its value
        return t.value

    best = max((t for t in trials if (t.params["a"], t.params["b"]) != ("a2", "b3")), key=value_of)
    scores = samplers._pair_scores(study, trials, set())
    moves = [
        params
        for lever, params in samplers._lever_moves(best, np.random.default_rng(0), {}, scores)
        if lever is None
    ]
    pairs = [tuple(k for k in ("a", "b", "c") if params[k] != best.params[k]) for params in moves]
    needle = {**best.params, "a": "a2", "b": "b3"}
    if best.params["a"] != "a2" and best.params["b"] != "b3":
        assert needle in moves
    assert all(len(changed) == 2 for changed in pairs)
    untried_pairs = sum(
        (len(CHOICES[x].choices) - 1) * (len(CHOICES[y].choices) - 1)
        for x, y in itertools.combinations(("a", "b", "c"), 2)
    )
    assert len(moves) < untried_pairs  # only pairs with evidence are moved together
