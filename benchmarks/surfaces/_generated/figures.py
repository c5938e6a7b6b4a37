"""Exact figures of a recipe's blocks: the needle fraction, the failure shares and the
calibration of the shape exponent."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .constants import FAILURES, K_RANGE, OK, WITHIN
from .recipe import Block, Recipe

# ---------------------------------------------------------------------------- exact figures


def _fraction(parts: Sequence[tuple[np.ndarray, np.ndarray]], tau: float) -> float:
    """P(sum of one draw from each independent part >= tau); a part is (values, probs)
    of its feasible points (an infeasible point is a miss)."""
    if any(len(v) == 0 for v, _ in parts):
        return 0.0
    maxes = [float(v.max()) for v, _ in parts]
    total = sum(maxes)
    pruned = []
    for (v, w), m in zip(parts, maxes, strict=True):
        keep = v >= tau - (total - m) - 1e-12
        u, inv = np.unique(v[keep], return_inverse=True)
        pruned.append((u, np.bincount(inv, weights=w[keep]), m))
    pruned.sort(key=lambda t: len(t[0]))
    while len(pruned) > 2:
        (x, px, mx), (y, py, my) = pruned[0], pruned[1]
        rest = sum(t[2] for t in pruned[2:])
        v = np.add.outer(x, y).ravel()
        w = np.multiply.outer(px, py).ravel()
        keep = v >= tau - rest - 1e-12
        u, inv = np.unique(v[keep], return_inverse=True)
        pruned = sorted(
            [(u, np.bincount(inv, weights=w[keep]), mx + my), *pruned[2:]],
            key=lambda t: len(t[0]),
        )
    (x, px, _), (y, py, _) = pruned
    suffix = np.concatenate([np.cumsum(py[::-1])[::-1], [0.0]])
    return float(np.sum(px * suffix[np.searchsorted(y, tau - x, side="left")]))


def _feasible(block: Block, lv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ok = block.fail == OK
    return lv[ok], block.probs[ok]


def _needle_fraction(blocks: Sequence[Block]) -> tuple[float, float]:
    """(needle fraction, log of the best feasible score before the offset)."""
    parts = [_feasible(b, b.lv) for b in blocks]
    best = sum(float(v.max()) for v, _ in parts)
    tau = best + math.log(WITHIN * (1.0 - 1e-9))
    return _fraction(parts, tau), best


def _shares(blocks: Sequence[Block]) -> dict[str, float]:
    """P(each failure class) of one random configuration (forbidden counted first)."""
    cdf = np.ones(5)
    for block in blocks:
        mass = np.bincount(block.fail, weights=block.probs, minlength=5)
        cdf = cdf * np.cumsum(mass)
    pmf = np.diff(np.concatenate([[0.0], cdf]))
    return {FAILURES.get(k, "ok"): float(pmf[k]) for k in range(5)}


def _calibrate(r: Recipe, target: float) -> float:
    """Set ``r.k`` to the shape exponent whose needle fraction is closest to ``target``
    (bisection on log k; the fraction grows with k); returns that fraction."""
    lo, hi = math.log(K_RANGE[0]), math.log(K_RANGE[1])
    best = (math.inf, 1.0, 0.0)
    for _ in range(14):
        mid = 0.5 * (lo + hi)
        r.k = math.exp(mid)
        frac, _ = _needle_fraction(r.blocks())
        miss = abs(math.log(max(frac, 1e-12) / target))
        if miss < best[0]:
            best = (miss, r.k, frac)
        if frac < target:
            lo = mid
        else:
            hi = mid
    r.k = best[1]
    return best[2]
