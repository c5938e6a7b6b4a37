"""The default sampler's local moves: the changes of the best trial worth trying, in order
(``_lever_moves``: two-way switches, other choices, numeric steps of 1/8 and 1/4 of a range,
pairs of categorical levers ranked by :mod:`autotune.study.screening`, flat levers, then
changes already seen to cost much), what single-lever moves changed (``_lever_effects``,
``_harmful_changes``) and random redraws of one lever (``_redraw``).

Split out of ``autotune/study/samplers.py`` (the public entry point, which re-exports these
names); :class:`~autotune.study._local_tpe.LocalTPESampler` plans each local move from
these. They draw from the generator they are given, in the order they always did: the same
seed gives the same proposals (BENCHMARKS.md, "Sample efficiency").
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial

from autotune.study.screening import PairKey, pair_scores

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
HARMFUL = 0.5
"""A change of one lever (from one value to another) that every single-lever move making it,
or undoing it, showed to cost at least this share of every objective is tried last from a
new incumbent. On the GPU studies `--enforce-eager` cost 79-99% and was tried again from each
new best (BENCHMARKS.md); a setting whose lever interacts with the new incumbent is still
tried, once the other moves are."""
Change = tuple[str, Any, Any]
"""(lever, value before, value after) of a single-lever move."""


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


def _moves(
    trials: list[FrozenTrial], failed: set[int]
) -> Iterator[tuple[str, FrozenTrial, FrozenTrial]]:
    """Each single-lever move with values whose origin was feasible: (lever, the move's
    trial, the trial it moved from)."""
    by_number = {t.number: t for t in trials}
    for t in trials:
        move = t.system_attrs.get(MOVE_ATTR)
        if not move:
            continue
        lever, origin = move
        base = by_number.get(origin)
        if base is None or base.number in failed or t.values is None or base.values is None:
            continue
        yield lever, t, base


def _lever_effects(trials: list[FrozenTrial], failed: set[int]) -> dict[str, float]:
    """The largest relative change a single-lever move made to any objective, per lever
    (1.0 when the move made the trial infeasible)."""
    effect: dict[str, float] = {}
    for lever, t, base in _moves(trials, failed):
        change = 1.0
        if t.number not in failed:
            change = max(
                abs(a - b) / max(abs(a), abs(b), 1e-12)
                for a, b in zip(t.values, base.values, strict=True)
            )
        effect[lever] = max(effect.get(lever, 0.0), change)
    return effect


def _harmful_changes(
    trials: list[FrozenTrial], failed: set[int], directions: list[StudyDirection]
) -> set[Change]:
    """The single-lever changes that cost at least :data:`HARMFUL` of every objective each
    time they were seen: a move from its origin, or the same move undone (a move that gained
    g says undoing it costs g / (1 + g)). A change seen once to cost less is not one."""
    worst: dict[Change, float] = {}
    for lever, t, base in _moves(trials, failed):
        if t.number in failed or lever not in t.params or lever not in base.params:
            continue
        gains = []  # how many times better the move's trial was, per objective
        for a, b, d in zip(t.values, base.values, directions, strict=True):
            if a <= 0 or b <= 0:
                break
            gains.append(a / b if d == StudyDirection.MAXIMIZE else b / a)
        else:
            forward = (lever, base.params[lever], t.params[lever])
            back = (lever, t.params[lever], base.params[lever])
            for change, cost in ((forward, 1 - max(gains)), (back, 1 - 1 / min(gains))):
                worst[change] = min(worst.get(change, math.inf), cost)
    return {change for change, cost in worst.items() if cost >= HARMFUL}


def _two_way(dist: BaseDistribution | None) -> bool:
    return isinstance(dist, CategoricalDistribution) and len(dist.choices) == 2


def _lever_moves(
    best: FrozenTrial,
    rng: np.random.Generator,
    effects: Mapping[str, float],
    scores: Mapping[PairKey, float],
    harmful: set[Change] | frozenset[Change] = frozenset(),
) -> Iterator[tuple[str | None, dict[str, Any]]]:
    """Changes of ``best`` in the order worth trying: (lever moved alone or None, params).

    Switches of a two-way lever first; then the other choices; then numbers 1/8 and 1/4 of
    their range away; then two categorical levers at once (an interaction: CUDA graphs pay
    only with static attention splits, a kernel only with one protocol), the pairs whose
    trials beat the main-effects model first (``scores``, :mod:`autotune.study.screening`),
    with two two-way levers that each mattered alone counted as such evidence; levers seen
    to be flat (every single move changed less than 0.5%) next; then the single-lever
    changes in ``harmful`` (:func:`_harmful_changes`), which cost much every time they were
    made. Random order within the other classes.
    """
    flat = {lever for lever, change in effects.items() if change < FLAT}
    sensitive = sorted(
        name
        for name, change in effects.items()
        if change >= SENSITIVE and _two_way(best.distributions.get(name))
    )
    classes: list[list[tuple[str | None, dict[str, Any]]]] = [[], [], [], [], [], []]
    for name, dist in best.distributions.items():
        current = best.params[name]
        if isinstance(dist, CategoricalDistribution):
            rank = 4 if name in flat else 0 if len(dist.choices) == 2 else 1
            for c in dist.choices:
                if c != current:
                    last = (name, current, c) in harmful
                    classes[5 if last else rank].append((name, {**best.params, name: c}))
            continue
        for delta in (-0.25, -0.125, 0.125, 0.25):
            value = _shift(dist, current, delta)
            if value != current:
                rank = 5 if (name, current, value) in harmful else 4 if name in flat else 2
                classes[rank].append((name, {**best.params, name: value}))
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
