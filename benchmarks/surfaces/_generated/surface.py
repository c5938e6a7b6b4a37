"""A generated surface from a recipe: its evaluator, noise model, optimum, baseline and
description."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from .constants import (
    ACCEPT,
    BASELINE_BAND,
    CRASHED,
    FAILURES,
    FORBIDDEN,
    OK,
    OOM,
    TARGETS,
    WRONG,
    Result,
)
from .figures import _calibrate, _needle_fraction, _shares
from .recipe import Block, Recipe

# ---------------------------------------------------------------------------- the surface


class _Evaluator:
    """A recipe's blocks at its scale: lookups for ``evaluate`` and ``noise_sigma``."""

    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe
        self.blocks = recipe.blocks()
        self.lv = [b.lv for b in self.blocks]
        self.reasons = _reasons(recipe)

    def indices(self, config: Mapping[str, Any]) -> tuple[dict[str, int], list[int]]:
        codes = self.recipe.codes_from_config(config)
        return codes, [b.index(codes) for b in self.blocks]

    def value_of(self, idx: Sequence[int]) -> float:
        total = self.lv[0][idx[0]] + self.lv[1][idx[1]] + self.lv[2][idx[2]]
        return float(self.recipe.v0 * math.exp(total - self.recipe.offset))

    def evaluate(self, config: Mapping[str, Any]) -> Result:
        codes, idx = self.indices(config)
        fails = [int(b.fail[i]) for b, i in zip(self.blocks, idx, strict=True)]
        worst = max(fails)
        value = self.value_of(idx)
        batch = float(self.blocks[0].batch[idx[0]])  # type: ignore[index]
        latency = 1000.0 * batch / value
        if worst == OK:
            return Result(value=value, latency_ms=latency)
        where = fails.index(worst)
        reason = self.reasons[(worst, where)](config)
        if worst == WRONG:  # fast, but wrong
            return Result(latency_ms=latency, failure="wrong_output", reason=reason)
        failure = "config_rejected" if worst == FORBIDDEN else FAILURES[worst]
        return Result(failure=failure, reason=reason)

    def noise_sigma(self, config: Mapping[str, Any]) -> float:
        _, idx = self.indices(config)
        return float(self.blocks[0].sigma[idx[0]])  # type: ignore[index]

    def deficits(self, config: Mapping[str, Any]) -> list[float]:
        _, idx = self.indices(config)
        return [b.best - float(b.lv[i]) for b, i in zip(self.blocks, idx, strict=True)]


def _reasons(r: Recipe) -> dict[tuple[int, int], Callable[[Mapping[str, Any]], str]]:
    mem, batch, trap = r.roles["mem"], r.roles["batch"], r.roles["trap"]
    a, b = r.roles["a"], r.roles.get("b")
    child = r.roles.get("child")
    return {
        (OOM, 0): lambda c: (
            f"CUDA out of memory: {mem}={c[mem]} leaves no room for the "
            f"activations of {batch}={c[batch]}"
            + (f" and a {child}={c[child]} draft" if child and child in c else "")
        ),
        (CRASHED, 0): lambda c: (
            f"illegal memory access in the draft tree ({child}={c.get(child)}, {batch}={c[batch]})"
        ),
        (FORBIDDEN, 0): lambda c: "forbidden: deep_speculation_large_batch",
        (CRASHED, 1): lambda c: f"kernel launch failed: {a}={c[a]} with {b}={c.get(b)}",
        (FORBIDDEN, 1): lambda c: f"forbidden: {a}={c[a]} with {b}={c.get(b)}",
        (WRONG, 1): lambda c: (
            f"greedy output differs from the reference ({trap}={c[trap]}, {a}={c[a]})"
        ),
    }


@dataclass(frozen=True)
class GeneratedSurface:
    """One generated surface: its space file, evaluator, noise model and exact figures."""

    name: str
    level: str
    seed: int
    space_data: dict[str, Any]
    optimum: float
    optimum_config: dict[str, Any]
    needle_fraction: float
    description: str
    baseline_value: float
    shares: dict[str, float]
    """P(forbidden / cuda_oom / crashed / wrong_output / ok) of a random configuration."""
    n_levers: int
    recipe: Recipe = field(compare=False, repr=False)
    evaluator: _Evaluator = field(compare=False, repr=False)

    def evaluate(self, config: Mapping[str, Any]) -> Result:
        """Launch one configuration (a TrialConfig of ``space``)."""
        return self.evaluator.evaluate(config)

    def noise_sigma(self, config: Mapping[str, Any]) -> float:
        """Lognormal sigma of one measurement of ``config``: larger at high batch and near
        the out-of-memory edge (1-6%; a flat 3% for the held-out preset)."""
        return self.evaluator.noise_sigma(config)

    def block_deficits(self, config: Mapping[str, Any]) -> list[float]:
        """Log deficit of ``config`` against the best feasible point of each block (numeric,
        categorical, main effects): the blocks are independent, so for a feasible
        configuration they sum to ``log(optimum / value)``."""
        return self.evaluator.deficits(config)

    @cached_property
    def space(self) -> Any:
        """The parsed ``SearchSpace`` (``autotune.space.loader.parse_space``)."""
        from autotune.space.loader import parse_space

        return parse_space(copy.deepcopy(self.space_data), file=f"<generated {self.name}>")


def _optimum(r: Recipe, blocks: Sequence[Block]) -> tuple[dict[str, int], list[float]]:
    codes: dict[str, int] = {n: r.lever(n).code(r.baseline[n]) for n in r.inert}
    maxes = []
    for block in blocks:
        lv = np.where(block.fail == OK, block.lv, -np.inf)
        i = int(np.argmax(lv))
        maxes.append(float(lv[i]))
        if block.shape:
            for name, code in zip(block.names, np.unravel_index(i, block.shape), strict=True):
                codes[name] = int(code)
    return codes, maxes


def _baseline_ratio(ev: _Evaluator, config: Mapping[str, Any], optimum: float) -> float:
    result = ev.evaluate(config)
    return result.value / optimum if result.failure is None else 0.0


def _nudge_baseline(r: Recipe, ev: _Evaluator, optimum: float) -> None:
    """Move the baseline's batch and main-effect levers until it scores 2-20% of the
    optimum (greedy, one lever a step, aiming at 7.5%)."""
    movable = [r.roles["batch"], r.roles["mem"], *r.main]
    goal = math.log(0.075)
    for _ in range(12):
        codes = {n: r.lever(n).code(v) for n, v in r.baseline.items()}
        ratio = _baseline_ratio(ev, r.config_from_codes(codes), optimum)
        if BASELINE_BAND[0] * 1.2 <= ratio <= BASELINE_BAND[1] * 0.9:
            return
        best: tuple[float, str | None, int] = (abs(math.log(max(ratio, 1e-12)) - goal), None, 0)
        for name in movable:
            for code in range(r.lever(name).n):
                trial = dict(codes, **{name: code})
                ratio_t = _baseline_ratio(ev, r.config_from_codes(trial), optimum)
                if ratio_t <= 0:
                    continue
                miss = abs(math.log(ratio_t) - goal)
                if miss < best[0] - 1e-9:
                    best = (miss, name, code)
        if best[1] is None:
            return
        r.baseline[best[1]] = r.lever(best[1]).values[best[2]]


def _finish(r: Recipe, *, calibrate: bool) -> GeneratedSurface | None:
    """Scale, optimum, baseline and figures of a recipe; None when it misses its level's
    requirements (the caller draws again)."""
    if calibrate:
        frac = _calibrate(r, TARGETS[r.level])
        lo, hi = ACCEPT[r.level]
        if not lo <= frac <= hi:
            return None
    blocks = r.blocks()
    frac, _ = _needle_fraction(blocks)
    codes, maxes = _optimum(r, blocks)
    if calibrate:
        r.offset = sum(maxes)
    ev = _Evaluator(r)
    optimum_config = r.config_from_codes(codes)
    optimum = ev.evaluate(optimum_config).value
    if calibrate:
        if not _structure_ok(r, codes, blocks):
            return None
        _nudge_baseline(r, ev, optimum)
    base_codes = {n: r.lever(n).code(v) for n, v in r.baseline.items()}
    base_config = r.config_from_codes(base_codes)
    base = ev.evaluate(base_config)
    if base.failure is not None or (
        calibrate and not BASELINE_BAND[0] <= base.value / optimum <= BASELINE_BAND[1]
    ):
        return None
    shares = _shares(blocks)
    return GeneratedSurface(
        name=r.name,
        level=r.level,
        seed=r.seed,
        space_data=r.space_data(),
        optimum=optimum,
        optimum_config=optimum_config,
        needle_fraction=frac,
        description=_describe(r, base.value / optimum, shares),
        baseline_value=base.value,
        shares=shares,
        n_levers=len(r.levers),
        recipe=r,
        evaluator=ev,
    )


def _structure_ok(r: Recipe, codes: Mapping[str, int], blocks: Sequence[Block]) -> bool:
    """The level's ingredients hold at the optimum and are reachable at random."""
    p = r.p
    a, b, c = r.roles["a"], r.roles.get("b"), r.roles.get("c")
    if r.level in ("medium", "heldout"):
        assert b is not None
        if (codes[a], codes[b]) != p["needle2"][:2]:
            return False  # the pairwise needle must be what the optimum needs
    if r.level == "hard":
        assert b is not None and c is not None
        if (codes[a], codes[b], codes[c]) != p["needle3"][:3]:
            return False
    shares = _shares(blocks)
    return shares["cuda_oom"] >= 0.03 and shares["wrong_output"] >= 0.02 and shares["ok"] >= 0.2


def _describe(r: Recipe, base_share: float, shares: Mapping[str, float]) -> str:
    p = r.p
    a, b, c = r.role("a"), r.role("b"), r.role("c")
    trap = r.role("trap")
    assert a is not None and trap is not None
    parts = [f"generated {r.level} surface, seed {r.seed}: {len(r.levers)} levers"]
    if "needle3" in p and b is not None and c is not None:
        na, nb, nc, gain = p["needle3"]
        parts.append(
            f"3-way needle {a.name}={a.values[na]} x {b.name}={b.values[nb]} x "
            f"{c.name}={c.values[nc]} (x{gain:.2f})"
        )
    elif "needle2" in p and b is not None:
        na, nb, gain = p["needle2"]
        parts.append(f"needle {a.name}={a.values[na]} x {b.name}={b.values[nb]} (x{gain:.2f})")
    parts.append(f"trap {trap.name}={trap.values[-1]} (x{p['trap_gain']:.2f}, wrong output)")
    parts.append(
        f"baseline at {100 * base_share:.1f}% of the optimum, {100 * shares['cuda_oom']:.0f}% "
        "of random configurations run out of memory"
    )
    if r.upgrades:
        parts.append("engine upgrade " + ", ".join(map(str, r.upgrades)))
    return "; ".join(parts)
