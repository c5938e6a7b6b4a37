"""Optional samplers for the sampler bake-off (issue 16): ``gp``, ``catcma`` and ``rfbo``.

Each needs a package autotune does not depend on, installed with its extra:
``pip install 'autotune[gp]'`` (torch, scipy), ``'autotune[catcma]'`` (cmaes),
``'autotune[rfbo]'`` (scikit-learn). The packages are imported when a sampler is built, never
when autotune is imported; a missing one is a :class:`~autotune.errors.ConfigError` naming
the sampler and the command. ``make_sampler`` (``autotune/study/samplers.py``) is the entry
point.

What the runner gives every sampler, and what each of these does with it:

* **Constraints.** ``finish_trial`` stores each constraint as the system attribute
  ``constraints:<key>`` (what ``Trial.set_constraint`` writes, which Optuna 5's samplers read
  through ``FrozenTrial.constraints``; ``constraints_func`` is deprecated) and once more as
  the old list ``constraints`` for optuna-dashboard, so ``FrozenTrial.constraints`` holds every
  constraint twice (``"0"``, ``"1"``, ... beside the names). ``gp`` is Optuna's
  ``GPSampler``, which models each constraint with its own Gaussian process and multiplies
  the expected improvement by the probability that all hold (constrained log EI); it is
  given the trials with the named keys only (``_NamedConstraints``: otherwise it fits every
  constraint twice and squares the probability). ``catcma`` and ``rfbo`` use
  :func:`autotune.results.feasible`: an infeasible trial (crashed, forbidden, an SLO missed)
  ranks below every feasible one.
* **The enqueued baseline** (and retries, enqueued too) is not sampled: all three return no
  relative parameters for a trial with ``fixed_params``, and learn from it once it is done.
  ``catcma`` starts its search distribution at the best trial of its start-up (the baseline
  when nothing beat it) and tells later enqueued trials to CatCMA as members of the current
  generation.
* **Conditional levers** (``when:``; present in some trials only). ``gp`` and ``catcma``
  model the levers every finished trial has (Optuna's intersection search space, computed
  after the random start-up); a lever that only some trials have (speculative steps with
  EAGLE, split-K with the split-K strategy) is drawn at random every time it is switched on.
  ``rfbo`` models all of them: an inactive lever is imputed (-1, or no category), which
  lever switches it on is inferred from the trials (``_gates``), and candidates carry values
  for every lever.
"""

from __future__ import annotations

import copy
import importlib
import math
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any, cast

import numpy as np
import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.samplers import BaseSampler, RandomSampler
from optuna.search_space import intersection_search_space
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import ConfigError
from autotune.results import feasible
from autotune.study._optuna_compat import CONSTRAINTS_KEY

EXTRA_SAMPLERS = ("gp", "catcma", "rfbo")
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
CMA_SIGMA0 = 0.2
"""CatCMA's initial step size on the [0, 1] range of each numeric lever."""
CMA_INCUMBENT_SHARE = 0.5
"""Probability CatCMA's first distribution adds to the best start-up trial's choice of each
categorical lever (the rest is uniform): the search starts around the incumbent."""
CMA_REDRAWS = 10
"""Samples CatCMA draws for one trial until one is a configuration not tried yet (once its
categorical distribution has converged, most draws repeat one)."""
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


def make_extra_sampler(name: str, *, seed: int | None, multi_objective: bool) -> BaseSampler:
    """``gp``, ``catcma`` or ``rfbo`` (see the module docstring)."""
    if name == "gp":
        return GaussianProcessSampler(seed=seed)
    if name == "catcma":
        if multi_objective:
            raise _single_objective(name)
        return CatCMASampler(seed=seed)
    if name == "rfbo":
        if multi_objective:
            raise _single_objective(name)
        return RandomForestSampler(seed=seed)
    raise ConfigError(f"unknown sampler {name!r}", field="--sampler", allowed=EXTRA_SAMPLERS)


# ---------------------------------------------------------------------------- shared pieces


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


# ---------------------------------------------------------------------------- gp


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


# ---------------------------------------------------------------------------- catcma


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


# ---------------------------------------------------------------------------- rfbo


Gates = dict[str, tuple[str, frozenset[int]]]


def _gates(trials: Sequence[FrozenTrial], space: Mapping[str, BaseDistribution]) -> Gates:
    """Which categorical lever switches each conditional one on, from the trials: ``p`` is
    present exactly when ``q`` is present and takes one of some choices (as indices).
    A lever whose presence follows no single lever is treated as always on."""
    seen = [t.params for t in trials if t.params]
    gates: Gates = {}
    for p in space:
        if all(p in params for params in seen):
            continue
        for q, dist in space.items():
            if q == p or not isinstance(dist, CategoricalDistribution):
                continue
            if any(q not in params for params in seen if p in params):
                continue
            on = {params[q] for params in seen if p in params}
            if all((params[q] in on) == (p in params) for params in seen if q in params):
                indices = frozenset(i for i, c in enumerate(dist.choices) if c in on)
                gates[p] = (q, indices)
                break
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
