"""Sampler choice (``--sampler``): TPE with local moves by default, tuned for conditional
spaces where a restart costs minutes and a crash costs a restart.

Measured in ``benchmarks/sample_efficiency.py`` (BENCHMARKS.md, "Sample efficiency and
crash-aware search").

Why one module of ~710 lines: the local-move sampler, its crash signatures and the grid
sampler share the planning state kept per trial; ``make_sampler`` is the only entry point.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
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

from autotune.errors import ConfigError
from autotune.failures import Failure
from autotune.results import dominates, feasible
from autotune.study._optuna_compat import storage_of, trial_id_of
from autotune.study.definition import SAMPLERS
from autotune.study.hints import Hints, own_count, startup_sampler
from autotune.study.screening import PairKey, pair_scores

_QUIET_INDEPENDENT: dict[str, Any] = (
    {"warn_independent_sampling": False}
    if tuple(int(p) for p in optuna.__version__.split(".")[:2]) < (4, 9)
    else {}
)
"""Levers a local move switches on are sampled independently: expected, not worth a warning
(the default from Optuna 4.9, where passing the argument is deprecated)."""

TPE_STARTUP_TRIALS = 10
"""Random trials (after the enqueued baseline) before TPE models the space."""
LOCAL_SHARE = 0.7
"""Share of the trials after the start-up that move levers of the best trial. Measured:
0.5-0.8 are within noise of each other on the three benchmark surfaces; 0.3 is slower."""
LEVERS_MOVED = ((1, 0.5), (2, 0.3), (3, 0.2))
"""How many levers a random move changes, with probabilities (once every planned move of
the incumbent has been tried)."""
MAX_MOVE_TRIES = 32
"""Random moves drawn before giving the trial to TPE (all tried already or crash-like)."""
PAIR_EVIDENCE = 0.02
"""Two categorical levers are moved together when their trials beat the main-effects model
by this much on the log scale (2%; :mod:`autotune.study.screening`), or when each mattered
alone; other pairs are left to the random multi-lever moves."""
MOVE_ATTR = "autotune:local_move"
"""Trial system attribute of a single-lever move: [lever, number of the trial it moved from]."""
FLAT = 0.005
"""A lever whose single moves changed the objective by less than this share is swept last."""
SENSITIVE = 0.05
"""Two two-way levers whose single moves each changed the objective by this share (or made
the trial infeasible) are also switched together."""
NEAR_FAILURE_LEVERS = 2
"""How many other levers away the evidence that a change fails may be."""
GUARD_RETRIES = 2
"""TPE proposals redrawn when they repeat a tried configuration or carry a failure
signature."""
RULE_NAME = re.compile(r"(?:^|; )([A-Za-z0-9_.-]+): ")
"""Rule names in the runner's reason for a forbidden trial (``name: why; name: why``)."""
CRASH_PATTERN_LEVERS = 3
"""An infeasible trial that differs from the incumbent in at most this many levers defines a
crash pattern (the change that broke it) that local moves do not repeat."""


def _fresh_seed() -> int:
    return int(np.random.default_rng().integers(2**32))


def _failed_numbers(trials: list[FrozenTrial]) -> set[int]:
    """Numbers of the infeasible trials (read once: constraints are parsed on each access)."""
    return {t.number for t in trials if not feasible(t)}


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
    change nothing; then random 1-3 lever moves.
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
        self._tpe = startup_sampler(tpe, hints, seed=seed, n_startup_trials=n_startup_trials)
        self._n_startup_trials = n_startup_trials
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
        if own_count(trials) < self._n_startup_trials or self._local_share <= 0:
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
        for lever, params in _lever_moves(best, rng, _lever_effects(trials, failed), scores):
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


def _pair_scores(study: Study, trials: list[FrozenTrial], failed: set[int]) -> dict[PairKey, float]:
    """:func:`autotune.study.screening.pair_scores` of the feasible trials (one objective)."""
    if len(study.directions) != 1:
        return {}
    sign = 1.0 if study.directions[0] == StudyDirection.MAXIMIZE else -1.0
    distributions: dict[str, BaseDistribution] = {}
    observations = []
    for t in trials:
        if t.number in failed or not t.params or t.values is None:
            continue
        distributions.update(t.distributions)
        value = t.values[0]
        if sign < 0:
            value = 1.0 / value if value > 0 else math.inf
        observations.append((t.params, value))
    return pair_scores(observations, distributions)


def _current(best: FrozenTrial, trials: list[FrozenTrial]) -> dict[str, BaseDistribution]:
    """``best``'s distributions that the latest trials still use (a resumed study whose
    space was edited must not be handed a value from an old range)."""
    latest: dict[str, BaseDistribution] = {}
    for t in trials:
        latest.update(t.distributions)
    return {k: d for k, d in best.distributions.items() if latest.get(k) == d}


def _finished(study: Study) -> list[FrozenTrial]:
    return study._get_trials(deepcopy=False, states=(TrialState.COMPLETE,), use_cache=True)


class _Tried:
    """The configurations tried so far, for constant-time "tried already?" checks."""

    def __init__(self, configs: Sequence[Mapping[str, Any]]) -> None:
        self._exact = {frozenset(c.items()) for c in configs}
        self._by_keys: dict[frozenset[str], list[Mapping[str, Any]]] = {}
        for c in configs:
            self._by_keys.setdefault(frozenset(c), []).append(c)
        self._projections: dict[tuple[frozenset[str], frozenset[str]], set[frozenset[Any]]] = {}

    def exact(self, params: Mapping[str, Any]) -> bool:
        return frozenset(params.items()) in self._exact

    def covers(self, params: Mapping[str, Any]) -> bool:
        """A tried configuration has every value of ``params`` (and possibly more levers:
        the ones a move switches on are drawn later, so any value of them counts)."""
        items = frozenset(params.items())
        if items in self._exact:
            return True
        keys = frozenset(params)
        for group, configs in self._by_keys.items():
            if not group > keys:
                continue
            seen = self._projections.get((group, keys))
            if seen is None:
                seen = {frozenset((k, c[k]) for k in keys) for c in configs}
                self._projections[(group, keys)] = seen
            if items in seen:
                return True
        return False


def _tried(study: Study, trial: FrozenTrial) -> _Tried:
    """Every finished or running trial but this one (parallel workers), as of this trial's
    ``ask`` (Optuna's per-trial cache: one storage read per trial for the whole sampler)."""
    states = (TrialState.COMPLETE, TrialState.RUNNING)
    trials = study._get_trials(deepcopy=False, states=states, use_cache=True)
    return _Tried([t.params for t in trials if t.number != trial.number and t.params])


Gates = dict[str, tuple[str, frozenset[Any]]]


def _gates(trials: list[FrozenTrial]) -> Gates:
    """Which lever switches each conditional lever on, as seen in the trials: ``p`` is
    present exactly when ``q`` takes one of some values (``speculative_num_steps`` when
    ``speculative`` is ``eagle``). Levers whose presence follows no single lever are left out.
    """
    seen = [t.params for t in trials if t.params]
    names = sorted({n for p in seen for n in p})
    gates: Gates = {}
    for p in names:
        if all(p in params for params in seen):
            continue
        for q in names:
            if q == p:
                continue
            if any(q not in params for params in seen if p in params):
                continue
            on = frozenset(params[q] for params in seen if p in params)
            if all((params[q] in on) == (p in params) for params in seen if q in params):
                gates[p] = (q, on)
                break
    return gates


def _active(params: Mapping[str, Any], gates: Gates) -> dict[str, Any]:
    """``params`` without the levers that its gates switch off."""
    out = dict(params)
    for _ in range(len(gates)):
        changed = False
        for p, (q, on) in gates.items():
            if p in out and (q not in out or out[q] not in on):
                del out[p]
                changed = True
        if not changed:
            break
    return out


def _lever_effects(trials: list[FrozenTrial], failed: set[int]) -> dict[str, float]:
    """The largest relative change a single-lever move made to any objective, per lever
    (1.0 when the move made the trial infeasible)."""
    by_number = {t.number: t for t in trials}
    effect: dict[str, float] = {}
    for t in trials:
        move = t.system_attrs.get(MOVE_ATTR)
        if not move:
            continue
        lever, origin = move
        base = by_number.get(origin)
        if base is None or base.number in failed or t.values is None:
            continue
        change = 1.0
        if t.number not in failed:
            change = max(
                abs(a - b) / max(abs(a), abs(b), 1e-12)
                for a, b in zip(t.values, base.values, strict=True)
            )
        effect[lever] = max(effect.get(lever, 0.0), change)
    return effect


def _two_way(dist: BaseDistribution | None) -> bool:
    return isinstance(dist, CategoricalDistribution) and len(dist.choices) == 2


def _lever_moves(
    best: FrozenTrial,
    rng: np.random.Generator,
    effects: Mapping[str, float],
    scores: Mapping[PairKey, float],
) -> Iterator[tuple[str | None, dict[str, Any]]]:
    """Changes of ``best`` in the order worth trying: (lever moved alone or None, params).

    Switches of a two-way lever first; then the other choices; then numbers 1/8 and 1/4 of
    their range away; then two categorical levers at once (an interaction: CUDA graphs pay
    only with static attention splits, a kernel only with one protocol), the pairs whose
    trials beat the main-effects model first (``scores``, :mod:`autotune.study.screening`),
    with two two-way levers that each mattered alone counted as such evidence; levers seen
    to be flat (every single move changed less than 0.5%) last. Random order within the
    other classes.
    """
    flat = {lever for lever, change in effects.items() if change < FLAT}
    sensitive = sorted(
        name
        for name, change in effects.items()
        if change >= SENSITIVE and _two_way(best.distributions.get(name))
    )
    classes: list[list[tuple[str | None, dict[str, Any]]]] = [[], [], [], [], []]
    for name, dist in best.distributions.items():
        current = best.params[name]
        if isinstance(dist, CategoricalDistribution):
            rank = 4 if name in flat else 0 if len(dist.choices) == 2 else 1
            for c in dist.choices:
                if c != current:
                    classes[rank].append((name, {**best.params, name: c}))
            continue
        for delta in (-0.25, -0.125, 0.125, 0.25):
            value = _shift(dist, current, delta)
            if value != current:
                classes[4 if name in flat else 2].append((name, {**best.params, name: value}))
    categorical = sorted(
        name
        for name, dist in best.distributions.items()
        if isinstance(dist, CategoricalDistribution) and name not in flat
    )
    pairs: list[tuple[float, float, dict[str, Any]]] = []
    for i, a in enumerate(categorical):
        for b in categorical[i + 1 :]:
            for va in best.distributions[a].choices:  # type: ignore[attr-defined]
                for vb in best.distributions[b].choices:  # type: ignore[attr-defined]
                    if va != best.params.get(a) and vb != best.params.get(b):
                        score = scores.get((a, va, b, vb), 0.0)
                        if a in sensitive and b in sensitive:
                            score = max(score, SENSITIVE)
                        pairs.append((score, float(rng.random()), {**best.params, a: va, b: vb}))
    pairs.sort(key=lambda p: (-p[0], p[1]))
    classes[3] = [(None, p) for score, _, p in pairs if score >= PAIR_EVIDENCE]
    for rank, moves in enumerate(classes):
        order = range(len(moves)) if rank == 3 else rng.permutation(len(moves))
        for i in order:
            yield moves[int(i)]


def _shift(dist: BaseDistribution, current: Any, delta: float) -> Any:
    """``current`` moved by ``delta`` of its (log) range, snapped to the grid."""
    assert isinstance(dist, (IntDistribution, FloatDistribution))
    lo, hi = float(dist.low), float(dist.high)
    x = float(current)
    if dist.log:
        lo, hi, x = math.log(lo), math.log(hi), math.log(x)
    x = min(max(x + delta * (hi - lo), lo), hi)
    if dist.log:
        x = math.exp(x)
    step = dist.step
    if step is not None:
        x = dist.low + step * round((x - dist.low) / step)
    if isinstance(dist, IntDistribution):
        return int(min(max(round(x), dist.low), dist.high))
    return float(min(max(x, dist.low), dist.high))


def _causes(trial: FrozenTrial) -> list[str]:
    """Why an infeasible trial failed: its failure class, or each forbidden rule it broke
    (user attribute ``violations`` when stored, else the names in the runner's reason,
    ``name: why; name: why``)."""
    failure = trial.user_attrs.get("failure")
    if not failure:
        return ["infeasible"]
    if failure == Failure.forbidden:
        rules = trial.user_attrs.get("violations")
        if not isinstance(rules, list):
            rules = RULE_NAME.findall(str(trial.user_attrs.get("reason") or ""))
        return [f"forbidden:{r}" for r in rules] or ["forbidden"]
    return [str(failure)]


Signature = tuple[dict[str, Any], list[tuple[str, str]]]
"""Lever values and orderings (``a > b``) that a failure cause needs."""


def _failure_signatures(trials: list[FrozenTrial], failed: set[int]) -> list[Signature]:
    """What every trial that failed for one cause has, and no trial of another outcome has.

    Two or more trials broke the same forbidden rule or crashed the same way: the lever
    values they share, and the orderings of two numeric levers they share (``min > max``),
    contain the cause (``moe_runner_backend=flashinfer_cutlass`` with ``checkpoint=mxfp4``).
    Any part that a trial of another outcome also has explains nothing and is dropped, so
    a signature never covers a configuration already seen to work.
    """
    groups: dict[str, list[FrozenTrial]] = {}
    for t in trials:
        if t.params and t.number in failed:
            for cause in _causes(t):
                groups.setdefault(cause, []).append(t)
    signatures: list[Signature] = []
    for members in groups.values():
        if len(members) < 2:
            continue
        ids = {t.number for t in members}
        others = [t for t in trials if t.number not in ids]
        common = dict(members[0].params)
        for t in members[1:]:
            common = {k: v for k, v in common.items() if k in t.params and t.params[k] == v}
        if common and not any(_matches(t.params, (common, [])) for t in others):
            signatures.append((common, []))
        numeric = [
            name
            for name, dist in members[0].distributions.items()
            if isinstance(dist, (IntDistribution, FloatDistribution))
            and all(name in t.params for t in members)
        ]
        for a in numeric:
            for b in numeric:
                if a == b or not all(t.params[a] > t.params[b] for t in members):
                    continue
                if not any(_matches(t.params, ({}, [(a, b)])) for t in others):
                    signatures.append(({}, [(a, b)]))
    return signatures


def _matches(params: Mapping[str, Any], signature: Signature) -> bool:
    values, orders = signature
    return all(name in params and params[name] == v for name, v in values.items()) and all(
        a in params and b in params and params[a] > params[b] for a, b in orders
    )


def _distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> int:
    return sum(a.get(k) != b.get(k) for k in a.keys() | b.keys())


def _change_failed_nearby(
    params: Mapping[str, Any], changed: Sequence[str], trials: list[FrozenTrial], failed: set[int]
) -> bool:
    """Among the tried configurations with the same new values of the ``changed`` levers,
    the closest (at most two other levers away) all failed: the change is known to crash
    or to be refused in this neighbourhood (fp16 accumulation without split-K, a bigger
    tile past the shared memory), whichever incumbent it is made from."""
    nearest = NEAR_FAILURE_LEVERS + 1
    all_failed = False
    for t in trials:
        if not t.params or any(t.params.get(k) != params.get(k) for k in changed):
            continue
        d = _distance(params, t.params)
        if d < nearest:
            nearest, all_failed = d, t.number in failed
        elif d == nearest:
            all_failed = all_failed and t.number in failed
    return all_failed


def _crash_patterns(
    best: FrozenTrial, trials: list[FrozenTrial], failed: set[int]
) -> list[dict[str, Any]]:
    """The changes from ``best`` that made a nearby trial infeasible (crash or forbidden)."""
    patterns = []
    for t in trials:
        if t.number not in failed or not t.params:
            continue
        diff = {
            name: t.params.get(name)
            for name in set(t.params) | set(best.params)
            if t.params.get(name) != best.params.get(name)
        }
        if 0 < len(diff) <= CRASH_PATTERN_LEVERS:
            patterns.append(diff)
    return patterns


def _repeats(
    params: Mapping[str, Any],
    base: Mapping[str, Any],
    pattern: Mapping[str, Any],
    distributions: Mapping[str, BaseDistribution],
) -> bool:
    """``params`` makes the change ``pattern`` made from ``base`` (numeric levers: moved at
    least as far in the same direction, since crash regions such as OOM grow monotonically
    with memory fraction, graph batch or speculative depth)."""
    for name, bad in pattern.items():
        value = params.get(name)
        dist = distributions.get(name)
        if bad is None or value is None or name not in base:
            if value != bad:
                return False
            continue
        if isinstance(dist, (IntDistribution, FloatDistribution)):
            start = dist.to_internal_repr(base[name])
            step = float(dist.to_internal_repr(bad)) - start
            moved = float(dist.to_internal_repr(value)) - start
            if step == 0 or moved * step <= 0 or abs(moved) < abs(step) * (1 - 1e-9):
                return False
        elif value != bad:
            return False
    return True


def _redraw(dist: BaseDistribution, current: Any, rng: np.random.Generator) -> Any:
    """Another value of one lever: any other choice, or for numbers a nearby value (half
    the time) or any value of the range."""
    if isinstance(dist, CategoricalDistribution):
        others = [c for c in dist.choices if c != current]
        return others[int(rng.integers(len(others)))] if others else current
    if isinstance(dist, IntDistribution):
        if dist.log:
            lo, hi = math.log(dist.low), math.log(dist.high)
            x = math.log(current) + rng.normal(0.0, 0.15 * (hi - lo))
            if rng.random() < 0.5:
                x = rng.uniform(lo, hi)
            value = int(round(math.exp(min(max(x, lo), hi))))
        else:
            n = (dist.high - dist.low) // dist.step
            i = (current - dist.low) // dist.step
            if rng.random() < 0.5:
                j = i + int(round(rng.normal(0.0, max(1.0, 0.15 * n))))
            else:
                j = int(rng.integers(n + 1))
            value = dist.low + dist.step * min(max(j, 0), n)
        return min(max(value, dist.low), dist.high)
    if isinstance(dist, FloatDistribution):
        if dist.step is not None:
            n = int(round((dist.high - dist.low) / dist.step))
            i = int(round((current - dist.low) / dist.step))
            if rng.random() < 0.5:
                j = i + int(round(rng.normal(0.0, max(1.0, 0.15 * n))))
            else:
                j = int(rng.integers(n + 1))
            return float(min(max(dist.low + dist.step * min(max(j, 0), n), dist.low), dist.high))
        lo, hi = (math.log(dist.low), math.log(dist.high)) if dist.log else (dist.low, dist.high)
        x = math.log(current) if dist.log else float(current)
        x = rng.uniform(lo, hi) if rng.random() < 0.5 else x + rng.normal(0.0, 0.15 * (hi - lo))
        x = min(max(x, lo), hi)
        return math.exp(x) if dist.log else x
    return current


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


def make_sampler(
    name: str,
    *,
    seed: int | None,
    grid: Mapping[str, Sequence[Any]] | None = None,
    multi_objective: bool = False,
    hints: Hints | None = None,
) -> optuna.samplers.BaseSampler:
    """Build a sampler by name.

    ``tpe`` (the default) is :class:`LocalTPESampler`: multivariate TPE with ``group=True``
    because the space is conditional (speculative steps exist only with EAGLE), constant
    liar so parallel workers spread out, plus crash-aware local moves around the best
    trial; with several objectives the moves start from Pareto-optimal trials. ``grid`` is
    :class:`RandomOrderGridSampler` over ``grid``. ``gp`` (Optuna's GPSampler), ``catcma``
    and ``rfbo`` (random-forest BO) need an extra each (``autotune/study/extra_samplers.py``).
    ``hints`` (the space's) shape the default sampler's start-up trials
    (:mod:`autotune.study.hints`); the others ignore them.
    """
    if name == "tpe":
        return LocalTPESampler(seed=seed, hints=hints)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        if not grid:
            raise ConfigError("the grid sampler needs a finite grid from the search space")
        return RandomOrderGridSampler(grid, seed=seed)
    if name == "qmc":
        # Scrambled: an unscrambled Sobol sequence ignores the seed, so every study (and
        # every seed of a benchmark) would propose the same points.
        return optuna.samplers.QMCSampler(seed=seed, scramble=True)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if name in ("gp", "catcma", "rfbo"):  # optional extras, imported only when chosen
        from autotune.study.extra_samplers import make_extra_sampler

        return make_extra_sampler(name, seed=seed, multi_objective=multi_objective)
    raise ConfigError(f"unknown sampler {name!r}", field="--sampler", allowed=SAMPLERS)
