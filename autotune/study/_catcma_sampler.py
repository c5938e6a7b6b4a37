"""``--sampler catcma``: :class:`CatCMASampler`, CatCMA (``cmaes.CatCMA``) over the levers
every trial has, one run (``_CMAState``: codec, optimizer, generation) per search space.

Split out of ``autotune/study/extra_samplers.py`` (the public entry point, which re-exports
these names and documents what every optional sampler does with constraints, the baseline
and conditional levers). cmaes is imported when the sampler is built (``_require``), never
at import.
"""

from __future__ import annotations

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
from optuna.trial import FrozenTrial, TrialState

from autotune.results import feasible
from autotune.study._extra_common import (
    STARTUP_TRIALS,
    _complete,
    _enqueued,
    _modelled_space,
    _require,
    _sign,
    _single_objective,
    _tried_keys,
    _Unit,
)

CMA_SIGMA0 = 0.2
"""CatCMA's initial step size on the [0, 1] range of each numeric lever."""
CMA_INCUMBENT_SHARE = 0.5
"""Probability CatCMA's first distribution adds to the best start-up trial's choice of each
categorical lever (the rest is uniform): the search starts around the incumbent."""
CMA_REDRAWS = 10
"""Samples CatCMA draws for one trial until one is a configuration not tried yet (once its
categorical distribution has converged, most draws repeat one)."""


class _CMAState:
    """One CatCMA run over one search space: the codec, the optimizer and its generation."""

    def __init__(
        self,
        space: Mapping[str, BaseDistribution],
        incumbent: Mapping[str, Any] | None,
        *,
        catcma: Any,
        seed: int,
        started_after: int,
    ) -> None:
        self.space = dict(space)
        self.numeric = [
            (n, _Unit(d))
            for n, d in space.items()
            if isinstance(d, (IntDistribution, FloatDistribution))
        ]
        self.categorical = [
            (n, d) for n, d in space.items() if isinstance(d, CategoricalDistribution)
        ]
        # CatCMA needs two numeric dimensions and one categorical one at least: dummies
        # (never decoded) fill up the gap.
        self.n_co = max(2, len(self.numeric))
        sizes = [len(d.choices) for _, d in self.categorical] or [2]
        self.cat_num = np.array(sizes)
        self.k_max = int(self.cat_num.max())
        mean = np.full(self.n_co, 0.5)
        q = np.zeros((len(sizes), self.k_max))
        for i, k in enumerate(sizes):
            q[i, :k] = 1.0 / k
        if incumbent is not None:
            x, c = self.encode(incumbent)
            mean = x
            share = CMA_INCUMBENT_SHARE
            for i in range(len(self.categorical)):
                k = sizes[i]
                q[i, :k] = (1.0 - share) / k
                q[i, int(np.argmax(c[i]))] += share
        bounds = np.tile([0.0, 1.0], (self.n_co, 1))
        self.optimizer = catcma(
            mean=mean,
            sigma=CMA_SIGMA0,
            cat_num=self.cat_num,
            bounds=bounds,
            seed=seed,
            cat_param=q,
        )
        self.started_after = started_after
        """Trials numbered up to this one are not told (the start-up, an earlier run)."""
        self.asked: dict[int, tuple[int, np.ndarray, np.ndarray]] = {}
        """Trial number -> (generation, x, c) of what this run proposed."""
        self.seen: set[int] = set()
        self.pending: list[tuple[tuple[np.ndarray, np.ndarray], FrozenTrial]] = []

    def encode(self, params: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        x = np.full(self.n_co, 0.5)
        for i, (name, unit) in enumerate(self.numeric):
            x[i] = unit.to_unit(params[name])
        c = np.zeros((len(self.cat_num), self.k_max), dtype=bool)
        if not self.categorical:
            c[0, 0] = True
        for i, (name, dist) in enumerate(self.categorical):
            c[i, int(dist.to_internal_repr(params[name]))] = True
        return x, c

    def decode(self, x: np.ndarray, c: np.ndarray) -> dict[str, Any]:
        params: dict[str, Any] = {}
        for i, (name, unit) in enumerate(self.numeric):
            params[name] = unit.to_value(x[i])
        for i, (name, dist) in enumerate(self.categorical):
            params[name] = dist.to_external_repr(int(np.argmax(c[i, : len(dist.choices)])))
        return params

    def covers(self, trial: FrozenTrial) -> bool:
        return all(
            name in trial.params and trial.distributions.get(name) == dist
            for name, dist in self.space.items()
        )


def _ranking_values(
    members: Sequence[FrozenTrial], trials: Sequence[FrozenTrial], sign: float
) -> list[float]:
    """Values to minimize for one generation: feasible trials their objective; infeasible
    ones worse than every feasible trial of the study (a larger violation worse still);
    trials that ended without values (FAIL) worst."""
    ok = [sign * t.values[0] for t in trials if feasible(t)]
    measured = [sign * t.values[0] for t in trials if t.values]
    base = max(ok) if ok else (max(measured) if measured else 0.0)
    out = []
    for t in members:
        if feasible(t):
            out.append(sign * t.values[0])
        elif t.state == TrialState.COMPLETE and t.values:
            excess = sum(max(0.0, float(v)) for v in t.constraints.values())
            out.append(base + 1.0 + excess / (1.0 + excess))
        else:
            out.append(base + 3.0)
    return out


class CatCMASampler(BaseSampler):
    """CatCMA (``cmaes.CatCMA``: CMA-ES on the numeric levers, a categorical distribution
    for the rest, updated together) over the levers every trial has; conditional levers and
    the start-up trials are random.

    After ``n_startup_trials`` finished trials, the run starts at the best of them (its
    numeric levers as the mean, its categorical choices made likelier), proposes one trial
    per ``ask`` and tells CatCMA a generation as soon as ``population_size`` of its
    trials finished (a draw that repeats a tried configuration is redrawn, ``CMA_REDRAWS``
    times at most). Trials it did not propose (enqueued, another worker's) count as members
    of the current generation. A changed search space or a converged run restarts from the
    best trial so far. The state lives in this process (a resumed study starts a new run from
    its best trial).
    """

    def __init__(self, *, seed: int | None = None, n_startup_trials: int = STARTUP_TRIALS) -> None:
        (cmaes,) = _require("catcma")
        self._catcma = cmaes.CatCMA
        self._random = RandomSampler(seed=seed)
        self._rng = np.random.default_rng(seed)
        self._n_startup_trials = n_startup_trials
        self._state: _CMAState | None = None
        self.restarts = 0

    def reseed_rng(self) -> None:
        self._random.reseed_rng()
        self._rng = np.random.default_rng()

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        if _enqueued(trial):
            return {}
        trials = _complete(study)
        if len(trials) < self._n_startup_trials:
            return {}
        return _modelled_space(trials)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space:
            return {}
        if len(study.directions) > 1:
            raise _single_objective("catcma")
        state = self._prepare(study, trial, search_space)
        tried = _tried_keys(study, trial, search_space)
        for _ in range(CMA_REDRAWS):
            x, c = state.optimizer.ask()
            params = state.decode(x, c)
            if frozenset(params.items()) not in tried:
                break
        state.asked[trial.number] = (state.optimizer.generation, x, c)
        return params

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def _prepare(
        self, study: Study, trial: FrozenTrial, space: dict[str, BaseDistribution]
    ) -> _CMAState:
        finished = study._get_trials(
            deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL), use_cache=True
        )
        complete = [t for t in finished if t.state == TrialState.COMPLETE]
        sign = _sign(study)
        state = self._state
        if state is None or state.space != space or state.optimizer.should_stop():
            state = self._start(space, complete, sign, started_after=trial.number - 1)
        for t in sorted(finished, key=lambda t: t.number):
            if t.number <= state.started_after or t.number in state.seen:
                continue
            state.seen.add(t.number)
            mine = state.asked.pop(t.number, None)
            if mine is not None:
                generation, x, c = mine
                if generation != state.optimizer.generation:
                    continue  # proposed from an older distribution (parallel workers)
            elif t.state == TrialState.COMPLETE and state.covers(t):
                x, c = state.encode(t.params)  # enqueued, or another worker's
            else:
                continue
            state.pending.append(((x, c), t))
            if len(state.pending) == state.optimizer.population_size:
                members = [m for _, m in state.pending]
                values = _ranking_values(members, complete, sign)
                solutions = [(s, v) for (s, _), v in zip(state.pending, values, strict=True)]
                state.optimizer.tell(solutions)
                state.pending = []
        return state

    def _start(
        self,
        space: dict[str, BaseDistribution],
        complete: Sequence[FrozenTrial],
        sign: float,
        *,
        started_after: int,
    ) -> _CMAState:
        usable = [
            t
            for t in complete
            if feasible(t) and all(n in t.params and t.distributions[n] == space[n] for n in space)
        ]
        best = min(usable, key=lambda t: (sign * t.values[0], t.number)) if usable else None
        if self._state is not None:
            self.restarts += 1
        self._state = _CMAState(
            space,
            best.params if best is not None else None,
            catcma=self._catcma,
            seed=int(self._rng.integers(2**31)),
            started_after=started_after,
        )
        return self._state
