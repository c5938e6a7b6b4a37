"""Sampler choice (``--sampler``): TPE by default, tuned for conditional spaces."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from autotune.errors import ConfigError
from autotune.study.definition import SAMPLERS


def make_sampler(
    name: str,
    *,
    seed: int | None,
    grid: Mapping[str, Sequence[Any]] | None = None,
    multi_objective: bool = False,
) -> optuna.samplers.BaseSampler:
    """Build a sampler by name.

    TPE runs multivariate with ``group=True`` because the space is conditional (speculative
    steps exist only with EAGLE), and with constant liar so parallel workers spread out.
    """
    if name == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed,
            multivariate=True,
            group=True,
            constant_liar=True,
            n_startup_trials=10,
        )
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        if not grid:
            raise ConfigError("the grid sampler needs a finite grid from the search space")
        return optuna.samplers.GridSampler(dict(grid), seed=seed)
    if name == "qmc":
        return optuna.samplers.QMCSampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    raise ConfigError(f"unknown sampler {name!r}", field="--sampler", allowed=SAMPLERS)
