"""``--sampler grid``: :class:`RandomOrderGridSampler`, grid search in random order that never
lists the grid.

Split out of ``autotune/study/samplers.py`` (the public entry point, which re-exports these
names and builds this sampler in ``make_sampler``): it shares nothing with the default
sampler but the trial id and storage accessors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import ConfigError
from autotune.study._optuna_compat import storage_of, trial_id_of

GRID_ATTR = "autotune:grid_point"
"""Trial system attribute: the index of the grid point a grid trial took."""


class RandomOrderGridSampler(BaseSampler):
    """Grid search that never lists the grid: each trial takes a point not visited yet,
    in random order (Optuna's GridSampler materialises every combination, 557 million for
    the bundled space at 3 levels, and calls ``study.stop()`` when done, which an ask/tell
    loop cannot take). Once every point was visited, points repeat (the runner reuses their
    results)."""

    def __init__(self, grid: Mapping[str, Sequence[Any]], *, seed: int | None = None) -> None:
        self._names = sorted(grid)
        self._values = [list(grid[name]) for name in self._names]
        if not all(self._values):
            raise ConfigError("the grid has a parameter without values")
        self.size = math.prod(len(v) for v in self._values)
        self._rng = np.random.default_rng(seed)
        self._points: dict[int, dict[str, Any]] = {}

    def reseed_rng(self) -> None:
        self._rng = np.random.default_rng()

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        point = self._points.get(trial_id_of(trial))
        if point is None:
            point = self._take(study, trial)
        if param_name not in point:
            raise ConfigError(f"the grid has no values for parameter {param_name!r}")
        return point[param_name]

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self._points.pop(trial_id_of(trial), None)

    def _take(self, study: Study, trial: FrozenTrial) -> dict[str, Any]:
        visited = {t.system_attrs.get(GRID_ATTR) for t in study._get_trials(deepcopy=False)} - {
            None
        }
        index = int(self._rng.integers(self.size))
        if len(visited) < self.size:
            while index in visited:
                index = int(self._rng.integers(self.size))
        storage_of(study).set_trial_system_attr(trial_id_of(trial), GRID_ATTR, index)
        point = {}
        for name, values in zip(self._names, self._values, strict=True):
            index, i = divmod(index, len(values))
            point[name] = values[i]
        self._points[trial_id_of(trial)] = point
        return point
