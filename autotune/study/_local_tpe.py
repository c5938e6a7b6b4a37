"""The default sampler (``--sampler tpe``): :class:`LocalTPESampler`, multivariate TPE plus
planned, crash-aware moves away from the best trial.

Split out of ``autotune/study/samplers.py`` (the public entry point, which re-exports these
names and builds this sampler in ``make_sampler``). The moves it plans come from
``_local_moves``, the guards from ``_crash_aware``, its view of the study from
``_trial_history``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

from autotune.results import dominates
from autotune.study._crash_aware import (
    _change_failed_nearby,
    _crash_patterns,
    _failed_numbers,
    _failure_signatures,
    _matches,
    _repeats,
)
from autotune.study._local_moves import (
    MOVE_ATTR,
    _current,
    _harmful_changes,
    _lever_effects,
    _lever_moves,
    _pair_scores,
    _redraw,
)
from autotune.study._optuna_compat import storage_of, trial_id_of
from autotune.study._trial_history import _active, _finished, _gates, _tried
from autotune.study.hints import Hints, in_startup, startup_sampler

_QUIET_INDEPENDENT: dict[str, Any] = (
    {"warn_independent_sampling": False}
    if tuple(int(p) for p in optuna.__version__.split(".")[:2]) < (4, 9)
    else {}
)
"""Levers a local move switches on are sampled independently: expected, not worth a warning
(the default from Optuna 4.9, where passing the argument is deprecated)."""
TPE_STARTUP_TRIALS = 10
"""Random trials (after the enqueued baseline) before TPE models the space; forbidden and
reused ones count (``hints.STARTUP_COUNTS`` says why)."""
LOCAL_SHARE = 0.7
"""Share of the trials after the start-up that move levers of the best trial. Measured:
0.5-0.8 are within noise of each other on the three benchmark surfaces; 0.3 is slower."""
LEVERS_MOVED = ((1, 0.5), (2, 0.3), (3, 0.2))
"""How many levers a random move changes, with probabilities (once every planned move of
the incumbent has been tried)."""
MAX_MOVE_TRIES = 32
"""Random moves drawn before giving the trial to TPE (all tried already or crash-like)."""
GUARD_RETRIES = 2
"""TPE proposals redrawn when they repeat a tried configuration or carry a failure
signature."""


def _fresh_seed() -> int:
    return int(np.random.default_rng().integers(2**32))


class LocalTPESampler(BaseSampler):
    """Multivariate TPE (``group=True``) plus planned moves away from the best trial.

    Why: the fastest serving setting is a narrow joint region (several levers must be right
    at once). TPE alone finds the region but then wanders, because its model of the good
    trials is wide: one missing lever (PCIe all-reduce left off, a memory fraction too low
    to hold the batch) can take it a hundred trials. So after ``n_startup_trials`` a
    trial is, with probability ``local_share``, a local move from the best feasible trial
    (a random Pareto-optimal one with several objectives), in this order: switch a two-way
    lever, another choice of a categorical one, a number 1/8 or 1/4 of its range away, two
    categorical levers at once (an interaction such as CUDA graphs + static attention
    splits; the pairs whose trials beat a main-effects model first), levers already seen to
    change nothing, changes already seen to cost half the objective or more (each time they,
    or their undoing, were a single move: ``--enforce-eager`` from every new best); then
    random 1-3 lever moves.
    Levers that a move switches on (conditional parameters) are drawn by TPE.

    Crash-aware: a move is skipped when it was tried, when it repeats a change that made a
    trial infeasible from this incumbent (numeric levers: as far or further in that
    direction, as OOM grows with memory fraction or batch), when the nearest tried
    configurations with the same new lever values failed, or when it carries the signature
    of a failure cause (what every trial that broke one forbidden rule or crashed one way
    had in common, and no other trial had). TPE proposals are redrawn (twice at most) on a
    signature or an exact repeat; TPE itself ranks infeasible trials (Optuna constraints)
    below every feasible one.
    """

    def __init__(
        self,
        *,
        seed: int | None = None,
        n_startup_trials: int = TPE_STARTUP_TRIALS,
        local_share: float = LOCAL_SHARE,
        hints: Hints | None = None,
        startup_counts: str = "trials",
    ) -> None:
        tpe = optuna.samplers.TPESampler(
            seed=seed,
            multivariate=True,
            group=True,
            constant_liar=True,
            n_startup_trials=n_startup_trials,
            **_QUIET_INDEPENDENT,
        )
        # The start-up trials (the space's hints, else the prior): autotune/study/hints.py.
        self._tpe = startup_sampler(
            tpe, hints, seed=seed, n_startup_trials=n_startup_trials, counts=startup_counts
        )
        self._n_startup_trials = n_startup_trials
        self._startup_counts = startup_counts
        self._local_share = local_share
        self._base_seed = seed if seed is not None else _fresh_seed()
        self._plans: dict[int, dict[str, Any]] = {}

    def reseed_rng(self) -> None:
        self._tpe.reseed_rng()
        self._base_seed = _fresh_seed()

    # ------------------------------------------------------------------ Optuna hooks

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        plan = self._plan(study, trial)
        if plan is None:
            return self._tpe.infer_relative_search_space(study, trial)
        space, params = plan
        self._plans[trial_id_of(trial)] = params
        return space

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        params = self._plans.get(trial_id_of(trial))
        if params is not None:
            return {k: v for k, v in params.items() if k in search_space}
        params = self._tpe.sample_relative(study, trial, search_space)
        if not params:
            return params
        trials = _finished(study)
        signatures = _failure_signatures(trials, _failed_numbers(trials))
        gates = _gates(trials)
        tried = _tried(study, trial)
        for _ in range(GUARD_RETRIES):
            active = _active(params, gates)
            if not (any(_matches(active, sig) for sig in signatures) or tried.exact(active)):
                break
            params = self._tpe.sample_relative(study, trial, search_space)
        return params

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self._tpe.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self._tpe.before_trial(study, trial)

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self._plans.pop(trial_id_of(trial), None)
        self._tpe.after_trial(study, trial, state, values)

    # ------------------------------------------------------------------ local moves

    def _incumbent(
        self, study: Study, trials: list[FrozenTrial], failed: set[int], rng: np.random.Generator
    ) -> FrozenTrial | None:
        usable = [t for t in trials if t.number not in failed and t.params]
        if not usable:
            return None
        directions = study.directions
        if len(directions) == 1:
            sign = -1.0 if directions[0] == StudyDirection.MAXIMIZE else 1.0
            return min(usable, key=lambda t: (sign * t.values[0], t.number))
        front = [
            t
            for t in usable
            if not any(dominates(o.values, t.values, directions) for o in usable if o is not t)
        ]
        return front[int(rng.integers(len(front)))]

    def _plan(
        self, study: Study, trial: FrozenTrial
    ) -> tuple[dict[str, BaseDistribution], dict[str, Any]] | None:
        """A local move for this trial, or None to let TPE sample it."""
        trials = _finished(study)
        # Trials a warm start carried are evidence, not the start-up's (autotune/study/hints.py).
        if in_startup(trials, self._n_startup_trials, self._startup_counts):
            return None
        if self._local_share <= 0:
            return None
        if trial.system_attrs.get("fixed_params"):  # enqueued (baseline, retry): not ours
            return None
        rng = np.random.default_rng([self._base_seed, trial.number])
        if rng.random() >= self._local_share:
            return None
        failed = _failed_numbers(trials)
        best = self._incumbent(study, trials, failed, rng)
        if best is None:
            return None
        tried = _tried(study, trial)
        patterns = _crash_patterns(best, trials, failed)
        signatures = _failure_signatures(trials, failed)
        gates = _gates(trials)
        scores = _pair_scores(study, trials, failed)
        harmful = _harmful_changes(trials, failed, list(study.directions))
        effects = _lever_effects(trials, failed)
        for lever, params in _lever_moves(best, rng, effects, scores, harmful):
            params = _active(params, gates)
            if tried.covers(params):
                continue
            changed = [k for k in params if params[k] != best.params.get(k)]
            if _change_failed_nearby(params, changed, trials, failed):
                continue
            if any(_repeats(params, best.params, p, best.distributions) for p in patterns):
                continue
            if any(_matches(params, sig) for sig in signatures):
                continue
            if lever is not None:
                storage_of(study).set_trial_system_attr(
                    trial_id_of(trial), MOVE_ATTR, [lever, best.number]
                )
            return _current(best, trials), params
        names = sorted(best.distributions)
        counts, weights = zip(*LEVERS_MOVED, strict=True)
        for _ in range(MAX_MOVE_TRIES):
            k = min(len(names), int(rng.choice(counts, p=weights)))
            moved = rng.choice(len(names), size=k, replace=False)
            params = dict(best.params)
            for i in moved:
                name = names[int(i)]
                params[name] = _redraw(best.distributions[name], params[name], rng)
            params = _active(params, gates)
            if params == best.params or tried.covers(params):
                continue
            if any(_repeats(params, best.params, p, best.distributions) for p in patterns):
                continue
            if any(_matches(params, sig) for sig in signatures):
                continue
            return _current(best, trials), params
        return None
