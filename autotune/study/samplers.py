"""Sampler choice (``--sampler``): TPE with local moves by default, tuned for conditional
spaces where a restart costs minutes and a crash costs a restart.

Measured in ``benchmarks/sample_efficiency.py`` (BENCHMARKS.md, "Sample efficiency and
crash-aware search").

This module is the samplers' public entry point: ``make_sampler`` builds one by name, and
the names others import are re-exported, unchanged, from the private modules that define
them, one concept each:

* ``_local_tpe``: :class:`LocalTPESampler` (the default, ``tpe``) and its constants;
* ``_local_moves``: the local moves it plans from the best trial, in order;
* ``_crash_aware``: failure causes, their signatures, crash patterns, changes that failed
  nearby;
* ``_trial_history``: the finished trials, the configurations tried, the conditional levers'
  gates;
* ``_grid_sampler``: :class:`RandomOrderGridSampler` (``grid``);
* ``_trial_seed``: :class:`TrialSeededSampler`, which every seeded sampler is wrapped in so
  that trial N draws the same whether the study ran in one go, was resumed or is shared by
  workers.

The optional samplers (``gp``, ``catcma``, ``rfbo``) live behind
``autotune/study/extra_samplers.py``, imported only when one is chosen. Import from here; to
patch a constant or function in a test, patch it where it is defined (the module that reads
it), since this facade only holds references.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from autotune.errors import ConfigError
from autotune.study._crash_aware import (
    CRASH_PATTERN_LEVERS,
    NEAR_FAILURE_LEVERS,
    RULE_NAME,
    Signature,
)
from autotune.study._crash_aware import _failed_numbers as _failed_numbers
from autotune.study._crash_aware import _failure_signatures as _failure_signatures
from autotune.study._crash_aware import _matches as _matches
from autotune.study._grid_sampler import GRID_ATTR, RandomOrderGridSampler
from autotune.study._local_moves import FLAT, MOVE_ATTR, PAIR_EVIDENCE, SENSITIVE
from autotune.study._local_moves import _lever_moves as _lever_moves
from autotune.study._local_moves import _pair_scores as _pair_scores
from autotune.study._local_tpe import (
    GUARD_RETRIES,
    LEVERS_MOVED,
    LOCAL_SHARE,
    MAX_MOVE_TRIES,
    TPE_STARTUP_TRIALS,
    LocalTPESampler,
)
from autotune.study._trial_history import Gates
from autotune.study._trial_history import _active as _active
from autotune.study._trial_history import _finished as _finished
from autotune.study._trial_history import _gates as _gates
from autotune.study._trial_seed import TrialSeededSampler, unwrap
from autotune.study.definition import SAMPLERS
from autotune.study.hints import Hints

__all__ = [
    "CRASH_PATTERN_LEVERS",
    "FLAT",
    "GRID_ATTR",
    "GUARD_RETRIES",
    "LEVERS_MOVED",
    "LOCAL_SHARE",
    "MAX_MOVE_TRIES",
    "MOVE_ATTR",
    "NEAR_FAILURE_LEVERS",
    "PAIR_EVIDENCE",
    "RULE_NAME",
    "SENSITIVE",
    "TPE_STARTUP_TRIALS",
    "Gates",
    "LocalTPESampler",
    "RandomOrderGridSampler",
    "Signature",
    "TrialSeededSampler",
    "make_sampler",
    "unwrap",
]


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

    With a ``seed`` the sampler comes wrapped in :class:`TrialSeededSampler` (its random
    states seeded from the seed and the trial's number before each trial: a resumed study
    does not propose its first run's configurations again); :func:`unwrap` gives the one
    underneath.
    """
    sampler = _build(name, seed=seed, grid=grid, multi_objective=multi_objective, hints=hints)
    return TrialSeededSampler(sampler, seed) if seed is not None else sampler


def _build(
    name: str,
    *,
    seed: int | None,
    grid: Mapping[str, Sequence[Any]] | None,
    multi_objective: bool,
    hints: Hints | None,
) -> optuna.samplers.BaseSampler:
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
