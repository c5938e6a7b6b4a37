"""What the optional samplers (``gp``, ``catcma``, ``rfbo``) share: the packages each needs
and the lazy import that checks them (``_require``: a missing one is a ConfigError naming
the extra to install), and the small adapters between Optuna's trials and a model (the
enqueued check, the finished trials, the objective's sign, the modelled space, ``_Unit``'s
[0, 1] scale of a numeric lever, the tried configurations).

Split out of ``autotune/study/extra_samplers.py`` (the public entry point, which re-exports
these names). Nothing here imports torch, scipy, cmaes or scikit-learn at import time: only
``_require`` does, when a sampler is built. A test that fakes a missing package patches
``_import`` here, where ``_require`` looks it up.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution
from optuna.search_space import intersection_search_space
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import ConfigError

MODULES = {
    "gp": ("torch", "scipy"),
    "catcma": ("cmaes",),
    "rfbo": ("sklearn.ensemble", "scipy.special"),
}
"""The modules each sampler imports (``autotune[NAME]`` installs their packages)."""
DISTRIBUTIONS = {"sklearn": "scikit-learn"}
"""Pip names of the packages whose module is named differently."""

STARTUP_TRIALS = 10
"""Random trials (the baseline included) before a model is fitted, as TPE's default."""


def _import(module: str) -> ModuleType:
    return importlib.import_module(module)


def _require(sampler: str) -> list[ModuleType]:
    """The modules ``sampler`` needs, or a ConfigError saying how to install them."""
    loaded: list[ModuleType] = []
    missing: list[str] = []
    for module in MODULES[sampler]:
        try:
            loaded.append(_import(module))
        except ImportError:
            package = module.split(".")[0]
            missing.append(DISTRIBUTIONS.get(package, package))
    if missing:
        raise ConfigError(
            f"the {sampler!r} sampler needs {' and '.join(missing)}, which is not installed: "
            f"pip install 'autotune[{sampler}]'",
            field="--sampler",
        )
    return loaded


def _single_objective(sampler: str) -> ConfigError:
    return ConfigError(
        f"the {sampler!r} sampler optimizes one objective; use gp, tpe or nsga2 for "
        "throughput_vs_tpot",
        field="--sampler",
    )


def _fresh_seed() -> int:
    return int(np.random.default_rng().integers(2**31))


def _enqueued(trial: FrozenTrial) -> bool:
    return bool(trial.system_attrs.get("fixed_params"))


def _complete(study: Study) -> list[FrozenTrial]:
    return study._get_trials(deepcopy=False, states=(TrialState.COMPLETE,), use_cache=True)


def _sign(study: Study) -> float:
    """Multiplier that turns the (single) objective into one to minimize."""
    return -1.0 if study.directions[0] == StudyDirection.MAXIMIZE else 1.0


def _modelled_space(trials: Sequence[FrozenTrial]) -> dict[str, BaseDistribution]:
    """The levers every finished trial has (the conditional ones left out), sorted."""
    space = intersection_search_space(list(trials))
    return {k: d for k, d in sorted(space.items()) if not d.single()}


class _Unit:
    """A numeric lever on [0, 1]: log scale when the lever is; integer and stepped ranges
    widened by half a step each side, so every value owns the same share."""

    def __init__(self, dist: IntDistribution | FloatDistribution) -> None:
        self.dist = dist
        self.step: float | None = dist.step
        low, high = float(dist.low), float(dist.high)
        if self.step is not None:
            low, high = low - self.step / 2, high + self.step / 2
        if dist.log:
            low, high = math.log(max(low, 1e-12)), math.log(high)
        self.low, self.width = low, max(high - low, 1e-12)

    def to_unit(self, value: Any) -> float:
        x = float(value)
        if self.dist.log:
            x = math.log(max(x, 1e-12))
        return min(max((x - self.low) / self.width, 0.0), 1.0)

    def to_value(self, u: float) -> Any:
        x = self.low + min(max(float(u), 0.0), 1.0) * self.width
        if self.dist.log:
            x = math.exp(x)
        low, high = float(self.dist.low), float(self.dist.high)
        if self.step is not None:
            x = low + self.step * round((x - low) / self.step)
        x = min(max(x, low), high)
        if isinstance(self.dist, IntDistribution):
            return int(round(x))
        return float(x)


def _tried_keys(
    study: Study, trial: FrozenTrial, space: Mapping[str, BaseDistribution]
) -> set[frozenset[tuple[str, Any]]]:
    """The tried configurations (finished or running, this trial aside) on ``space``."""
    states = (TrialState.COMPLETE, TrialState.RUNNING)
    trials = study._get_trials(deepcopy=False, states=states, use_cache=True)
    return {
        frozenset((n, v) for n, v in t.params.items() if n in space)
        for t in trials
        if t.number != trial.number and t.params
    }
