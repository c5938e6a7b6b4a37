"""What the default sampler's start-up counts (``autotune.study.hints.in_startup``): every own
trial by default; with ``startup_counts="launches"`` (measured, not adopted:
``hints.STARTUP_COUNTS``) forbidden proposals and reused results launch nothing and do not
shorten it, up to a cap.
"""

from __future__ import annotations

from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, create_trial

from autotune.space import SearchSpace, parse_space
from autotune.study._optuna_compat import storage_of, trial_id_of
from autotune.study.hints import STARTUP_TRIAL_CAP, in_startup
from autotune.study.samplers import (
    MOVE_ATTR,
    TPE_STARTUP_TRIALS,
    LocalTPESampler,
    TrialSeededSampler,
    make_sampler,
)
from autotune.study.warm_start import WARM_START_ATTR

LEVERS = ("a", "b", "c", "d")


def _trial(**attrs: Any) -> FrozenTrial:
    base: dict[str, Any] = {"failure": None, "reused_from": None}
    return create_trial(
        params={"a": 0},
        distributions={"a": CategoricalDistribution([0, 1])},
        value=1.0,
        user_attrs={**base, **attrs},
    )


def test_forbidden_reused_and_carried_trials_do_not_count_as_launches() -> None:
    launched = [_trial() for _ in range(4)] + [_trial(failure="cuda_oom")]  # a crash counts
    free = [_trial(failure="forbidden"), _trial(reused_from=2), _trial(**{WARM_START_ATTR: "x"})]
    assert in_startup(launched + free * 3, 6, "launches")
    assert not in_startup(launched + [_trial()], 6, "launches")
    # The default: every own trial counts, carried ones still not.
    assert not in_startup(launched + free, 6)
    assert in_startup(launched + [_trial(**{WARM_START_ATTR: "x"})], 6)


def test_the_start_up_ends_after_the_cap_even_without_launches() -> None:
    forbidden = [_trial(failure="forbidden") for _ in range(STARTUP_TRIAL_CAP * 5 - 1)]
    assert in_startup(forbidden, 5, "launches")
    assert not in_startup([*forbidden, _trial(failure="forbidden")], 5, "launches")


def test_an_unknown_count_is_refused() -> None:
    with pytest.raises(ValueError, match="trials, launches"):
        LocalTPESampler(seed=1, startup_counts="restarts")


def _space() -> SearchSpace:
    params = {
        n: {"type": "categorical", "choices": [0, 1, 2, 3], "target": {"env": n.upper()}}
        for n in LEVERS
    }
    return parse_space(
        {
            "name": "half-forbidden",
            "services": ["s"],
            "engine": {"name": "generic"},
            "parameters": params,
            # Half of the random draws break it: the shape of the MoE space's Marlin rule.
            "forbidden": [{"name": "low_a", "when": "a < 2", "reason": "refused"}],
            "baseline": {n: 2 for n in LEVERS},
        },
        file="toy.yaml",
    )


def _launches_before_the_first_move(counts: str | None, seed: int) -> int | None:
    """Run the loop as the runner does (forbidden: stored infeasible, nothing measured) and
    return how many launches came before the first planned local move. ``counts`` None: the
    sampler ``make_sampler`` gives."""
    space = _space()
    sampler = (
        make_sampler("tpe", seed=seed)
        if counts is None
        else TrialSeededSampler(LocalTPESampler(seed=seed, startup_counts=counts), seed)
    )
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial(space.baseline_params(), user_attrs={"is_baseline": True})
    launches = 0
    for _ in range(40):
        trial = study.ask()
        config = space.suggest(trial)
        moved = storage_of(study).get_trial_system_attrs(trial_id_of(trial)).get(MOVE_ATTR)
        if moved is not None:
            return launches
        forbidden = bool(space.violations(config))
        trial.set_user_attr("failure", "forbidden" if forbidden else None)
        trial.set_user_attr("reused_from", None)
        study.tell(trial, 0.0 if forbidden else 1.0 + sum(int(config[n]) for n in LEVERS))
        launches += not forbidden
    return None


def test_counted_in_launches_local_moves_wait_for_ten_whatever_the_forbidden_share() -> None:
    now = [_launches_before_the_first_move("launches", seed) for seed in range(6)]
    before = [_launches_before_the_first_move("trials", seed) for seed in range(6)]
    # No planned move before the tenth launch (one may come later: a trial after the start-up
    # is a move with probability LOCAL_SHARE, else TPE's).
    assert all(n is not None and n >= TPE_STARTUP_TRIALS for n in now), now
    # Counted in trials (the default), the forbidden half of the draws ended it earlier.
    assert sum(n is not None and n < TPE_STARTUP_TRIALS for n in before) >= 4, before
    assert [_launches_before_the_first_move(None, seed) for seed in range(6)] == before
