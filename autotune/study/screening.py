"""Interaction screening: which pairs of lever values did better than their levers alone.

Why: some gains exist only for a combination (a kernel that pays only with one all-reduce
protocol), and each of its values on its own is no better, or worse, than the incumbent's.
Moving one lever at a time from the best trial never finds such a pair. Trying every pair
of other values is quadratic; the trials already run say which pairs to try first. A main
-effects model (ridge regression of the log objective on one-hot categorical levers and
numeric positions) is fitted to the feasible trials; a pair of values whose trials sit above
that model (positive mean residual) is evidence of an interaction, one that sits below is
evidence against, and a pair never tried scores zero.
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

RIDGE = 1.0
"""Ridge penalty of the main-effects fit (the features are one-hot or 0..1)."""

PairKey = tuple[str, Any, str, Any]
"""(lever a, value of a, lever b, value of b) with a < b."""


def _numeric_position(dist: IntDistribution | FloatDistribution, value: Any) -> float:
    low, high, x = float(dist.low), float(dist.high), float(value)
    if dist.log:
        low, high, x = math.log(low), math.log(high), math.log(x)
    return 0.0 if high == low else (x - low) / (high - low)


def _features(
    params: Mapping[str, Any], distributions: Mapping[str, BaseDistribution], names: Sequence[str]
) -> list[float]:
    row: list[float] = []
    for name in names:
        dist = distributions[name]
        value = params.get(name)
        if isinstance(dist, CategoricalDistribution):
            row.extend(1.0 if value == c else 0.0 for c in dist.choices)
        elif isinstance(dist, (IntDistribution, FloatDistribution)):
            x = _numeric_position(dist, value) if value is not None else 0.5
            row.extend((x, x * x))
    return row


def pair_scores(
    observations: Sequence[tuple[Mapping[str, Any], float]],
    distributions: Mapping[str, BaseDistribution],
) -> dict[PairKey, float]:
    """Mean residual of the log objective over the trials holding each pair of categorical
    values (``observations``: feasible trials' params and objective, larger is better)."""
    usable = [(p, y) for p, y in observations if y > 0 and math.isfinite(y)]
    categorical = sorted(
        n for n, d in distributions.items() if isinstance(d, CategoricalDistribution)
    )
    if len(usable) < 3 or len(categorical) < 2:
        return {}
    names = sorted(distributions)
    x = np.array([[1.0, *_features(p, distributions, names)] for p, _ in usable])
    y = np.log([v for _, v in usable])
    penalty = RIDGE * np.eye(x.shape[1])
    penalty[0, 0] = 0.0  # the intercept is not shrunk
    coef = np.linalg.solve(x.T @ x + penalty, x.T @ y)
    residuals = y - x @ coef
    sums: dict[PairKey, list[float]] = {}
    for (params, _), r in zip(usable, residuals, strict=True):
        present = [n for n in categorical if n in params]
        for i, a in enumerate(present):
            for b in present[i + 1 :]:
                entry = sums.setdefault((a, params[a], b, params[b]), [0.0, 0.0])
                entry[0] += float(r)
                entry[1] += 1.0
    return {key: total / count for key, (total, count) in sums.items()}
