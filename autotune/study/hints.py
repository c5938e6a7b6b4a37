"""The default sampler's start-up trials: the space author's hints (``hint: {value: V,
strength: S}`` on a parameter), else the prior.

The start-up is the trials before TPE models the space, counted over the study's own trials
(:func:`in_startup`): the failed launches a warm start carried from an earlier study are
evidence (crash signatures learn from them at once), not exploration, so they do not shorten
the start-up (counted, the 13-20 failed launches a warm start carries ended it before the
study measured anything of its own, and left TPE and the local moves little more than the
baseline: BENCHMARKS.md, "Warm start after an upgrade"). Forbidden proposals and reused
results do count, though they launch nothing: counting launches only was measured and
gained nothing (:data:`STARTUP_COUNTS`).

A hint is a value its author expects to be good and how sure they are (S in (0, 1]). It acts
only during the start-up:

* the first sampled start-up trial is "all hints": the baseline with every hinted lever set
  to its hint (levers that neither sets are drawn from the prior), so a set of hints is
  tried as a whole once, and a wrong one costs that trial;
* every other start-up trial draws each hinted lever from its hint with probability S, and
  from the prior (uniform over its domain, as Optuna's random sampler draws) otherwise;
  unhinted levers always come from the prior.

After the start-up, TPE and the local moves see the trials the hints shaped and nothing else:
TPE's prior over a lever stays Optuna's (Optuna has no hook to centre it on a value, and
seeding it with made-up observations would put trials in the study that never ran).

:class:`StartupSampler` wraps the TPE sampler inside
:class:`autotune.study.samplers.LocalTPESampler` and draws the start-up trials itself (its
prior is a random sampler with TPE's seed, so without hints and carried trials every draw is
the one TPE would make); afterwards it hands everything to TPE.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.samplers import BaseSampler
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

from autotune.results import carried, feasible, launched
from autotune.space import SearchSpace
from autotune.space.model import choice_key
from autotune.study._optuna_compat import storage_of, trial_id_of

ALL_HINTS_ATTR = "autotune:all_hints"
"""Trial system attribute of the study's "all hints" trial (there is one at most)."""


@dataclass(frozen=True)
class Hints:
    """The hinted levers of a space: value and strength, and the baseline the "all hints"
    trial starts from."""

    values: Mapping[str, Any]
    strengths: Mapping[str, float]
    baseline: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_space(cls, space: SearchSpace) -> Hints | None:
        """The space's hints; ``None`` when it has none."""
        hints = space.hints()
        if not hints:
            return None
        return cls(
            values={n: v for n, (v, _) in hints.items()},
            strengths={n: s for n, (_, s) in hints.items()},
            baseline=space.baseline_params() if space.has_baseline else {},
        )

    def __bool__(self) -> bool:
        return bool(self.values)

    @property
    def all_hints_differ(self) -> bool:
        """The "all hints" configuration is not the baseline itself."""
        return any(
            name not in self.baseline or choice_key(self.baseline[name]) != choice_key(value)
            for name, value in self.values.items()
        )


def _fresh_seed() -> int:
    return int(np.random.default_rng().integers(2**32))


def _within(dist: BaseDistribution, value: Any) -> bool:
    """``value`` is one ``dist`` can give (a resumed study's space may have been edited)."""
    if isinstance(dist, CategoricalDistribution):
        return any(
            choice_key(c) == choice_key(value) and type(c) is type(value) for c in dist.choices
        )
    if isinstance(dist, (IntDistribution, FloatDistribution)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return dist.low <= value <= dist.high
    return False


STARTUP_COUNTS = ("trials", "launches")
"""What the start-up counts. ``trials`` (the default): every own trial, forbidden and reused
ones too. ``launches``: only own trials that launched their configuration (crashed or not),
ending after :data:`STARTUP_TRIAL_CAP` times the start-up's own trials at the latest.

Why not launches, though a forbidden proposal costs no restart: on the H100 MoE study 5 of
the first 10 trials were forbidden (vLLM refuses Marlin for bf16 experts) and TPE began from
5 measurements, so counting launches looked like a free gain. Measured on 30 generated
surfaces whose rules forbid 50-60% of random draws, as the GPU spaces' do (10 seeds each,
side by side, BENCHMARKS.md "What the start-up counts"), it is not: the best found after 16
launches averaged 77.7% of the optimum with ``launches`` and 78.0% with ``trials`` (8: 66.5
vs 66.0%, 32: 87.2% both), and ``launches`` proposed 17 forbidden configurations per 100
trials against 12: a forbidden trial is evidence too, and TPE learns the rules from it sooner
than the random start-up does. Kept as an option for the benchmark
(``tpe-launch-startup``)."""


STARTUP_TRIAL_CAP = 3
"""The start-up ends after this many times ``n_startup_trials`` own trials, launched or not
(:func:`in_startup`)."""


def in_startup(trials: Sequence[FrozenTrial], n_startup: int, counts: str = "trials") -> bool:
    """The study is still in its start-up: fewer than ``n_startup`` of its own trials count
    towards it (:data:`STARTUP_COUNTS`). Counting ``launches``, a space whose random draws
    are almost all forbidden would keep the start-up going for hundreds of free trials while
    TPE, which learns where the rules are, waits: so it also ends after
    :data:`STARTUP_TRIAL_CAP` times ``n_startup`` own trials."""
    own = [t for t in trials if not carried(t)]
    if counts == "trials":
        return len(own) < n_startup
    if len(own) >= STARTUP_TRIAL_CAP * n_startup:
        return False
    return sum(1 for t in own if launched(t)) < n_startup


class StartupSampler(BaseSampler):
    """``inner`` with its start-up trials drawn here: from the space's hints, else from the
    prior (module docstring).

    While fewer than ``n_startup_trials`` of the study's own trials are complete, every
    lever is drawn here, one at a time (no relative search space); afterwards everything
    goes to ``inner`` unchanged.
    """

    def __init__(
        self,
        inner: BaseSampler,
        hints: Hints | None,
        *,
        seed: int | None,
        n_startup_trials: int,
        counts: str = "trials",
    ) -> None:
        if counts not in STARTUP_COUNTS:
            raise ValueError(f"start-up counts {counts!r}: one of {', '.join(STARTUP_COUNTS)}")
        self._counts = counts
        self._inner = inner
        self._hints = hints or Hints(values={}, strengths={})
        self._n_startup_trials = n_startup_trials
        self._seed = seed if seed is not None else _fresh_seed()
        self._prior = optuna.samplers.RandomSampler(seed=self._seed)
        self._all: dict[int, bool] = {}
        """Ids of the trials drawn as "all hints" -> whether the attribute says so yet."""

    def reseed_rng(self) -> None:
        self._inner.reseed_rng()
        self._prior.reseed_rng()
        self._seed = _fresh_seed()

    def _starting(self, study: Study) -> bool:
        trials = study._get_trials(deepcopy=False, states=(TrialState.COMPLETE,), use_cache=True)
        return in_startup(trials, self._n_startup_trials, self._counts)

    # ------------------------------------------------------------------ Optuna hooks

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self._inner.before_trial(study, trial)
        if (
            trial.system_attrs.get("fixed_params")  # enqueued: not sampled
            or not self._hints.all_hints_differ
            or not self._starting(study)
        ):
            return
        if not any(ALL_HINTS_ATTR in t.system_attrs for t in study._get_trials(deepcopy=False)):
            self._all[trial_id_of(trial)] = False

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        if self._starting(study):
            return {}
        return self._inner.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space:
            return {}
        return self._inner.sample_relative(study, trial, search_space)

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        if not self._starting(study):
            return self._inner.sample_independent(study, trial, param_name, param_distribution)
        hints = self._hints
        if trial_id_of(trial) in self._all:
            if not self._all[trial_id_of(trial)]:  # marked once it takes a value from here
                storage_of(study).set_trial_system_attr(trial_id_of(trial), ALL_HINTS_ATTR, True)
                self._all[trial_id_of(trial)] = True
            for source in (hints.values, hints.baseline):
                if param_name in source and _within(param_distribution, source[param_name]):
                    return source[param_name]
        elif (
            param_name in hints.values
            and _within(param_distribution, hints.values[param_name])
            and not self._refuted(study)
        ):
            rng = np.random.default_rng([self._seed, trial.number, zlib.crc32(param_name.encode())])
            if rng.random() < hints.strengths[param_name]:
                return hints.values[param_name]
        return self._prior.sample_independent(study, trial, param_name, param_distribution)

    def _refuted(self, study: Study) -> bool:
        """The "all hints" trial failed, or did no better than the baseline: the hints are
        taken as wrong and the remaining start-up trials draw from the prior alone."""
        trials = study._get_trials(deepcopy=False, states=(TrialState.COMPLETE,), use_cache=True)
        tried = next((t for t in trials if t.system_attrs.get(ALL_HINTS_ATTR)), None)
        if tried is None:
            return False
        if not feasible(tried):
            return True
        base = next((t for t in trials if t.user_attrs.get("is_baseline") and feasible(t)), None)
        if base is None:
            return False
        sign = 1.0 if study.directions[0] == StudyDirection.MAXIMIZE else -1.0
        return sign * tried.values[0] <= sign * base.values[0]

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self._all.pop(trial_id_of(trial), None)
        self._inner.after_trial(study, trial, state, values)


def startup_sampler(
    sampler: BaseSampler,
    hints: Hints | None,
    *,
    seed: int | None,
    n_startup_trials: int,
    counts: str = "trials",
) -> BaseSampler:
    """``sampler`` with its first ``n_startup_trials`` own trials (:func:`in_startup`) drawn
    from ``hints`` (when the space has any) and the prior."""
    return StartupSampler(
        sampler, hints, seed=seed, n_startup_trials=n_startup_trials, counts=counts
    )
