"""Seeded synthetic tuning surfaces (issue 16): a family of pure functions, no servers.

``generate(seed, level=...)`` draws one surface: a search space (``space_data``, parsed by
the real ``autotune.space.loader.parse_space``: conditional ``when:`` levers, ``forbidden:``
rules and a baseline included), an evaluator (``evaluate(config) -> Result``), a
heteroscedastic noise model (``noise_sigma(config)``), the exact optimum and the exact
share of the space (under ``SearchSpace.random_config``'s distribution) within 5% of it.
Same ``(seed, level)``, same surface. ``family(30)`` is ten of each level;
``perturb(surface, seed)`` is a seeded "engine upgrade" of a surface.

How a surface is built. The levers fall into three independent blocks, and the score is
``V0 * exp(lv_num + lv_cat + lv_main - offset)``:

* the *numeric* block: a memory-like lever (float or int with a step), a batch-like int,
  and (medium, hard, some easy) a speculative gate with a conditional depth. The KV
  capacity grows with memory, throughput grows with the batch (linear, then
  compute-bound) up to that capacity and falls past it (preemption), a little with the
  memory (prefix hits), speculation pays at small batch and costs at large batch. This
  block keeps its own shape: it is where the baseline's distance from the optimum lives.
  ``cuda_oom`` above a memory threshold that drops with the batch and with the draft's
  memory; ``crashed`` for deep speculation at large batch; a forbidden corner of it.
* the *categorical* block: two or three categoricals with main effects, a smooth pairwise
  interaction, and pure needles (a gain only for one exact combination of two (medium)
  or three (hard) choices, with no partial credit: the needle's choices are not the best
  on their own); a wrong-output trap (an aggressive approximation, faster by its gain,
  wrong everywhere (easy), for half the first categorical's choices (medium), or at the
  3-way needle's third choice (hard: the trap sits one lever away from the optimum); a
  conditional lever active under one choice of the second categorical (some hard); a
  crashing pair and a forbidden pair.
* the *main-effect* block: separable levers of every kind (categorical, int with a step,
  log int, float with a step, bool), multiplicative main effects of varied size (random
  for choices; peaked or monotone over the range for numbers) and additive ones
  (``log(exp(sum effects) + sum additive)``).
* inert levers do nothing at all.

A failure in any block fails the launch (forbidden > cuda_oom > crashed > wrong_output).
The blocks are independent, so the optimum is the product of the blocks' feasible maxima
(each block enumerated exactly: a few thousand points) and the needle fraction is exact:
every lever's probability under ``random_config`` (uniform on a grid; log ints by the
interval that rounds to each integer) multiplies across its block, and the blocks combine
by one outer sum and a sorted search. One shape exponent ``k`` reshapes every effect
table of the categorical and main-effect blocks, keeping its range (a deficit that is a
share d of the range becomes d ** k: broad plateaus for k > 1, sharp peaks for k < 1); it
is set by bisection so that the needle fraction lands in the level's band (easy 1-5%,
medium 0.1-1%, hard < 0.1%), and a draw that cannot get there, or whose optimum is not on
its needle, or whose crash and trap regions are too small to meet at random, is drawn
again (seeded: still the same surface for the same seed). The baseline (defaults: low
batch, conservative memory, first choices, no speculation, no approximation) is then
nudged, batch, memory and main-effect levers only, until it sits at 2-20% of the optimum.

Generating one surface (calibration included) takes 5-100 ms; ``python
benchmarks/surfaces/generated.py [N]`` prints the family's figures.

Presets: ``level="heldout"`` is shaped like the held-out surface a user reported: six
levers (two categoricals with an interaction and a gain for exactly one combination, a
memory/batch crash region, a wrong-output trap, one main-effect lever), 3% noise.
"""

from __future__ import annotations

import copy
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

# The code lives in benchmarks/surfaces/_generated/, by concept; this file is its entry point
# and keeps the names it had (benchmarks/_sample_efficiency/surfaces.py and
# benchmarks/warm_start.py load it by path, `python benchmarks/surfaces/generated.py` runs
# it): the package is found from the repository root.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from benchmarks.surfaces._generated.constants import (  # noqa: E402
    ACCEPT,
    BANDS,
    BASELINE_BAND,
    CRASHED,
    FAILURES,
    FORBIDDEN,
    K_RANGE,
    LEVELS,
    LEVER_COUNTS,
    NAME_RE,
    NOISE,
    NUM_SHAPE,
    OK,
    OOM,
    PRESETS,
    SIGMA_RANGE,
    TARGETS,
    WITHIN,
    WRONG,
    Result,
)
from benchmarks.surfaces._generated.draw import _draw  # noqa: E402
from benchmarks.surfaces._generated.levers import (  # noqa: E402
    BATCH_POOL,
    CAT_POOL,
    CHILD2_POOL,
    GATE_POOL,
    INERT_POOL,
    MAIN_POOL,
    MEM_POOL,
    TRAP_POOL,
    Lever,
)
from benchmarks.surfaces._generated.recipe import Block, Recipe  # noqa: E402
from benchmarks.surfaces._generated.surface import GeneratedSurface, _finish  # noqa: E402
from benchmarks.surfaces._generated.upgrade import _upgrade  # noqa: E402

__all__ = [
    "ACCEPT",
    "BANDS",
    "BASELINE_BAND",
    "BATCH_POOL",
    "CAT_POOL",
    "CHILD2_POOL",
    "CRASHED",
    "FAILURES",
    "FORBIDDEN",
    "GATE_POOL",
    "INERT_POOL",
    "K_RANGE",
    "LEVELS",
    "LEVER_COUNTS",
    "MAIN_POOL",
    "MEM_POOL",
    "NAME_RE",
    "NOISE",
    "NUM_SHAPE",
    "OK",
    "OOM",
    "PRESETS",
    "SIGMA_RANGE",
    "TARGETS",
    "TRAP_POOL",
    "WITHIN",
    "WRONG",
    "Block",
    "GeneratedSurface",
    "Lever",
    "Recipe",
    "Result",
    "by_name",
    "family",
    "family_names",
    "generate",
    "perturb",
    "stats",
]


# ---------------------------------------------------------------------------- public API


def generate(seed: int, *, level: str) -> GeneratedSurface:
    """The surface ``gen-<level>-<seed>``: same arguments, same surface."""
    if level not in LEVELS + PRESETS:
        raise ValueError(f"unknown level {level!r} (one of {', '.join(LEVELS + PRESETS)})")
    for attempt in range(40):
        surface = _finish(_draw(seed, level, attempt), calibrate=True)
        if surface is not None:
            return surface
    raise RuntimeError(f"no {level} surface for seed {seed} met its level in 40 draws")


def family_names(n: int = 30, *, first_seed: int = 0) -> list[str]:
    """The names ``family`` returns, without building them: levels in turn, seeds from
    ``first_seed`` (``gen-easy-0, gen-medium-0, gen-hard-0, gen-easy-1, ...``)."""
    return [f"gen-{LEVELS[i % 3]}-{first_seed + i // 3}" for i in range(n)]


def family(n: int = 30, *, first_seed: int = 0) -> list[GeneratedSurface]:
    """``n`` surfaces, the three levels in turn (30: ten of each)."""
    return [by_name(name) for name in family_names(n, first_seed=first_seed)]


def by_name(name: str) -> GeneratedSurface:
    """``gen-<level>-<seed>``, optionally followed by ``-up<k>`` upgrades (``perturb``)."""
    match = NAME_RE.fullmatch(name)
    if match is None:
        raise ValueError(f"not a generated surface name: {name!r} (gen-<level>-<seed>[-up<k>])")
    surface = generate(int(match.group(2)), level=match.group(1))
    for up in re.findall(r"-up(\d+)", match.group(3)):
        surface = perturb(surface, int(up))
    return surface


def perturb(surface: GeneratedSurface, seed: int) -> GeneratedSurface:
    """A seeded "engine upgrade": the same levers (a main-effect categorical may gain or
    lose a choice), every smooth effect shifted by 10-30% either way, the OOM threshold
    moved by one to two and a half memory steps, maybe one needle moved to a neighbouring
    choice. The scale and the score's offset are kept, the optimum and the needle fraction
    recomputed, so the old best is a good but not exact start."""
    for attempt in range(20):
        rng = np.random.default_rng(
            [61, seed, surface.seed, (LEVELS + PRESETS).index(surface.level), attempt]
        )
        r = copy.deepcopy(surface.recipe)
        r.upgrades = (*r.upgrades, seed)
        _upgrade(r, rng)
        out = _finish(r, calibrate=False)
        if out is None:
            continue
        old = out.evaluate(surface.optimum_config)
        if out.optimum_config == surface.optimum_config or old.failure is not None:
            continue
        if not 0.5 <= old.value / out.optimum < 0.999:
            continue
        return out
    raise RuntimeError(f"no upgrade {seed} of {surface.name} kept its old best launchable")


def stats(surfaces: Sequence[GeneratedSurface]) -> list[dict[str, Any]]:
    """One row per surface (for the docs): levers, needle fraction, baseline share,
    failure shares."""
    return [
        {
            "name": s.name,
            "levers": s.n_levers,
            "needle_fraction": s.needle_fraction,
            "baseline_share": s.baseline_value / s.optimum,
            **{k: v for k, v in s.shares.items()},
            "k": s.recipe.k,
        }
        for s in surfaces
    ]


if __name__ == "__main__":
    import sys
    import time

    count = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    started = time.perf_counter()
    fam = family(count)
    took = time.perf_counter() - started
    for row in stats(fam):
        print(
            f"{row['name']:<16} {row['levers']:>2} levers"
            f"  needle {100 * row['needle_fraction']:7.4f}%"
            f"  baseline {100 * row['baseline_share']:5.1f}%  oom {100 * row['cuda_oom']:4.1f}%"
            f"  crashed {100 * row['crashed']:4.1f}%  wrong {100 * row['wrong_output']:4.1f}%"
            f"  forbidden {100 * row['forbidden']:4.1f}%  k={row['k']:.2f}"
        )
    print(f"{count} surfaces in {took:.2f} s ({1000 * took / count:.0f} ms each)")
