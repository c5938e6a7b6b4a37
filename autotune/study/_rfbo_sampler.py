"""``--sampler rfbo``: :class:`RandomForestSampler`, random-forest Bayesian optimization in
the style of SMAC, with ``_Forest`` (configurations as lever positions and forest features)
and ``_gates`` (which categorical lever switches each conditional one on).

Split out of ``autotune/study/extra_samplers.py`` (the public entry point, which re-exports
these names and documents what every optional sampler does with constraints, the baseline
and conditional levers). scikit-learn and scipy are imported when the sampler is built
(``_require``), never at import.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.samplers import BaseSampler, RandomSampler
from optuna.study import Study
from optuna.trial import FrozenTrial

from autotune.results import feasible
from autotune.study._extra_common import (
    STARTUP_TRIALS,
    _complete,
    _enqueued,
    _fresh_seed,
    _require,
    _sign,
    _single_objective,
    _tried_keys,
    _Unit,
)
from autotune.study._trial_history import infer_gates

RF_TREES = 32
RF_MAX_FEATURES = 5 / 6
"""Share of the features each split considers (SMAC's random forest)."""
RF_MIN_SAMPLES_SPLIT = 3
RF_RANDOM_EVERY = 5
"""Every this many trials (by trial number), ``rfbo`` samples at random (SMAC's interleaved
random configurations: the model's blind spots get visited)."""
RF_RANDOM_CANDIDATES = 1000
RF_LOCAL_STARTS = 10
"""Local searches of the acquisition function, from the best trials so far."""
RF_LOCAL_STEPS = 10
RF_NEIGHBOUR_SIGMA = 0.2
"""A numeric lever's neighbours: a normal step of this share of its range (SMAC's 0.2)."""


Gates = dict[str, tuple[str, frozenset[int]]]


def _gates(trials: Sequence[FrozenTrial], space: Mapping[str, BaseDistribution]) -> Gates:
    """Which categorical lever switches each conditional one on, from the trials: ``p`` is
    present exactly when ``q`` is present and takes one of some choices (as indices).
    A lever whose presence follows no single lever is treated as always on. The inference
    is the local-move sampler's (``_trial_history.infer_gates``: levers that always come
    together never gate each other), with categorical gates only."""
    seen = [t.params for t in trials if t.params]
    categorical = [q for q, d in space.items() if isinstance(d, CategoricalDistribution)]
    gates: Gates = {}
    for p, (q, on) in infer_gates(seen, list(space), categorical).items():
        dist = space[q]
        assert isinstance(dist, CategoricalDistribution)
        gates[p] = (q, frozenset(i for i, c in enumerate(dist.choices) if c in on))
    return gates


class _Forest:
    """Configurations as rows of lever positions (a numeric lever on [0, 1], a categorical
    one as its choice's index) and as the forest's features (numeric: the position, -1
    when inactive; categorical: one-hot, all zeros when inactive)."""

    def __init__(self, space: Mapping[str, BaseDistribution], gates: Gates) -> None:
        self.names = list(space)
        self.dists = [space[n] for n in self.names]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.units: list[_Unit | None] = [
            _Unit(d) if isinstance(d, (IntDistribution, FloatDistribution)) else None
            for d in self.dists
        ]
        self.sizes = [
            len(d.choices) if isinstance(d, CategoricalDistribution) else 0 for d in self.dists
        ]
        self.columns: list[int] = []
        width = 0
        for k in self.sizes:
            self.columns.append(width)
            width += k or 1
        self.width = width
        order: list[tuple[int, int, np.ndarray]] = []
        pending = dict(gates)
        while pending:  # outer gates first (a gate may itself be conditional)
            ready = [p for p, (q, _) in pending.items() if q not in pending]
            if not ready:
                break  # a cycle: impossible from real trials; ignore the rest
            for p in sorted(ready):
                q, on = pending.pop(p)
                order.append((self.index[p], self.index[q], np.array(sorted(on))))
        self.gates = order

    def rows(self, params_list: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
        """Positions and presence of trials' parameters (absent or out of range: inactive)."""
        u = np.zeros((len(params_list), len(self.names)))
        present = np.zeros_like(u, dtype=bool)
        for r, params in enumerate(params_list):
            for j, name in enumerate(self.names):
                if name not in params:
                    continue
                unit = self.units[j]
                try:
                    if unit is not None:
                        u[r, j] = unit.to_unit(params[name])
                    else:
                        u[r, j] = float(self.dists[j].to_internal_repr(params[name]))
                except (ValueError, TypeError):
                    continue
                present[r, j] = True
        return u, present

    def active(self, u: np.ndarray) -> np.ndarray:
        """Which levers of candidate rows are on, by the inferred gates."""
        on = np.ones_like(u, dtype=bool)
        for p, q, values in self.gates:
            on[:, p] = on[:, q] & np.isin(u[:, q], values)
        return on

    def features(self, u: np.ndarray, on: np.ndarray) -> np.ndarray:
        out = np.zeros((len(u), self.width))
        rows = np.arange(len(u))
        for j, k in enumerate(self.sizes):
            col = self.columns[j]
            if k == 0:
                out[:, col] = np.where(on[:, j], u[:, j], -1.0)
            else:
                idx = np.clip(u[:, j].astype(int), 0, k - 1)
                out[rows[on[:, j]], col + idx[on[:, j]]] = 1.0
        return out

    def random(self, rng: np.random.Generator, n: int) -> np.ndarray:
        u = np.empty((n, len(self.names)))
        for j, k in enumerate(self.sizes):
            u[:, j] = rng.integers(k, size=n) if k else rng.random(n)
        return self.snap(u)

    def snap(self, u: np.ndarray) -> np.ndarray:
        """Numeric positions moved onto the values they decode to (integers, steps)."""
        for j, unit in enumerate(self.units):
            if unit is not None and unit.step is not None:
                u[:, j] = [unit.to_unit(unit.to_value(x)) for x in u[:, j]]
        return u

    def neighbours(self, u: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Each row once per lever, with that lever changed (another choice, a nearby
        number)."""
        n, d = u.shape
        out = np.repeat(u, d, axis=0)
        lever = np.tile(np.arange(d), n)
        rows = np.arange(n * d)
        for j, k in enumerate(self.sizes):
            at = rows[lever == j]
            if k:
                out[at, j] = (out[at, j] + rng.integers(1, k, size=len(at))) % k
            else:
                step = rng.normal(0.0, RF_NEIGHBOUR_SIGMA, size=len(at))
                out[at, j] = np.clip(out[at, j] + step, 0.0, 1.0)
        return self.snap(out)

    def decode(self, row: np.ndarray) -> dict[str, Any]:
        params: dict[str, Any] = {}
        for j, name in enumerate(self.names):
            unit = self.units[j]
            if unit is not None:
                params[name] = unit.to_value(row[j])
            else:
                params[name] = self.dists[j].to_external_repr(int(row[j]))
        return params


class RandomForestSampler(BaseSampler):
    """Random-forest Bayesian optimization in the style of SMAC.

    After ``n_startup_trials`` random trials, each trial fits a random forest (scikit-learn,
    ``RF_TREES`` trees, bootstrapped, 5/6 of the features per split) to every finished trial
    (one-hot categorical levers, numeric ones on [0, 1], inactive conditional levers imputed;
    an infeasible trial is given the worst feasible value), takes the mean and spread of the
    trees' predictions, and proposes the configuration with the largest expected improvement
    over the best feasible trial among ``RF_RANDOM_CANDIDATES`` random ones and the points
    of ``RF_LOCAL_STARTS`` hill climbs (one lever at a time) from the best trials, skipping
    configurations already tried. Every ``RF_RANDOM_EVERY``-th trial is random.
    """

    def __init__(
        self,
        *,
        seed: int | None = None,
        n_startup_trials: int = STARTUP_TRIALS,
        random_every: int = RF_RANDOM_EVERY,
    ) -> None:
        ensemble, special = _require("rfbo")
        self._forest_class = ensemble.RandomForestRegressor
        self._ndtr = special.ndtr
        self._random = RandomSampler(seed=seed)
        self._seed = seed if seed is not None else _fresh_seed()
        self._n_startup_trials = n_startup_trials
        self._random_every = random_every

    def reseed_rng(self) -> None:
        self._random.reseed_rng()
        self._seed = _fresh_seed()

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        if _enqueued(trial):
            return {}
        if self._random_every > 0 and trial.number % self._random_every == 0:
            return {}
        trials = _complete(study)
        if len(trials) < self._n_startup_trials:
            return {}
        latest: dict[str, BaseDistribution] = {}
        for t in sorted(trials, key=lambda t: t.number):
            latest.update(t.distributions)
        return {k: d for k, d in sorted(latest.items()) if not d.single()}

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space:
            return {}
        if len(study.directions) > 1:
            raise _single_objective("rfbo")
        trials = [t for t in _complete(study) if t.params]
        if not trials:
            return {}
        sign = _sign(study)
        ok = [sign * t.values[0] for t in trials if feasible(t)]
        worst = max(ok) if ok else 0.0
        y = np.array([sign * t.values[0] if feasible(t) else worst for t in trials])
        model = _Forest(search_space, _gates(trials, search_space))
        u_seen, present = model.rows([t.params for t in trials])
        rng = np.random.default_rng([self._seed, trial.number])
        forest = self._forest_class(
            n_estimators=RF_TREES,
            max_features=RF_MAX_FEATURES,
            min_samples_split=RF_MIN_SAMPLES_SPLIT,
            bootstrap=True,
            random_state=int(rng.integers(2**31)),
            n_jobs=1,
        ).fit(model.features(u_seen, present), y)
        best_y = float(y.min())

        def expected_improvement(u: np.ndarray) -> np.ndarray:
            x = model.features(u, model.active(u)).astype(np.float32)
            preds = np.stack([tree.predict(x, check_input=False) for tree in forest.estimators_])
            mean, spread = preds.mean(axis=0), preds.std(axis=0)
            gain = best_y - mean
            with np.errstate(divide="ignore", invalid="ignore"):
                z = np.where(spread > 0, gain / spread, 0.0)
            pdf = np.exp(-0.5 * z**2) / math.sqrt(2 * math.pi)
            ei = np.where(spread > 0, gain * self._ndtr(z) + spread * pdf, np.maximum(gain, 0))
            return np.asarray(ei)

        pool = [model.random(rng, RF_RANDOM_CANDIDATES)]
        scores = [expected_improvement(pool[0])]
        starts = [trials[i] for i in np.argsort(y, kind="stable")[:RF_LOCAL_STARTS]]
        current, present = model.rows([t.params for t in starts])
        filler = model.random(rng, len(starts))  # values for levers a start has switched off
        current = np.where(present, current, filler)
        current_ei = expected_improvement(current)
        pool.append(current)
        scores.append(current_ei)
        for _ in range(RF_LOCAL_STEPS):
            near = model.neighbours(current, rng)
            near_ei = expected_improvement(near)
            pool.append(near)
            scores.append(near_ei)
            d = current.shape[1]
            by_start = near_ei.reshape(len(current), d)
            pick = by_start.argmax(axis=1)
            better = by_start[np.arange(len(current)), pick] > current_ei
            if not better.any():
                break
            moved = near.reshape(len(current), d, d)[np.arange(len(current)), pick]
            current = np.where(better[:, None], moved, current)
            current_ei = np.where(better, by_start[np.arange(len(current)), pick], current_ei)
        candidates = np.concatenate(pool)
        ei = np.concatenate(scores)
        on = model.active(candidates)
        tried = _tried_keys(study, trial, search_space)
        for i in np.argsort(-ei, kind="stable"):
            params = model.decode(candidates[i])
            key = frozenset((n, v) for j, (n, v) in enumerate(params.items()) if on[i, j])
            if key not in tried:
                return params
        return model.decode(candidates[int(np.argmax(ei))])

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self._random.sample_independent(study, trial, param_name, param_distribution)
