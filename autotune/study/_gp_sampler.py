"""``--sampler gp``: :class:`GaussianProcessSampler`, Optuna's GPSampler that fits no model
for an enqueued trial and sees each constraint once (``_NamedConstraints``).

Split out of ``autotune/study/extra_samplers.py`` (the public entry point, which re-exports
these names and documents what every optional sampler does with constraints, the baseline
and conditional levers). torch and scipy are imported when the sampler is built
(``_require``), never at import.
"""

from __future__ import annotations

import copy
from typing import Any, cast

import optuna
from optuna.distributions import BaseDistribution
from optuna.study import Study
from optuna.trial import FrozenTrial

from autotune.study._extra_common import STARTUP_TRIALS, _enqueued, _require
from autotune.study._optuna_compat import CONSTRAINTS_KEY


class _NamedConstraints:
    """A study whose trials carry each constraint once: the named keys, without the old list
    ``finish_trial`` also writes for optuna-dashboard. Everything else is the study."""

    def __init__(self, study: Study) -> None:
        self._study = study

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(self, *args: Any, **kwargs: Any) -> list[FrozenTrial]:
        return [_named_only(t) for t in self._study._get_trials(*args, **kwargs)]


def _named_only(trial: FrozenTrial) -> FrozenTrial:
    attrs = trial.system_attrs
    if not CONSTRAINTS_KEY or CONSTRAINTS_KEY not in attrs:
        return trial
    prefix = f"{CONSTRAINTS_KEY}:"
    if not any(k.startswith(prefix) for k in attrs):
        return trial
    view = copy.copy(trial)
    view.system_attrs = {k: v for k, v in attrs.items() if k != CONSTRAINTS_KEY}
    return view


class GaussianProcessSampler(optuna.samplers.GPSampler):
    """Optuna's Gaussian-process sampler (log EI; constrained and multi-objective variants),
    random for the start-up trials and for conditional levers.

    Two changes: an enqueued trial (the baseline, a retry) fits no model, and the model sees
    each constraint once (``_NamedConstraints``)."""

    def __init__(self, *, seed: int | None = None, n_startup_trials: int = STARTUP_TRIALS):
        _require("gp")
        super().__init__(
            seed=seed, n_startup_trials=n_startup_trials, warn_independent_sampling=False
        )

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        if _enqueued(trial):
            return {}
        return super().infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space:
            return {}
        return super().sample_relative(cast(Study, _NamedConstraints(study)), trial, search_space)
