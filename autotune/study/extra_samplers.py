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

This module is their public entry point: ``make_extra_sampler`` builds one by name, and the
names others import are re-exported, unchanged, from the private modules that define them:

* ``_extra_common``: the packages each sampler needs and their lazy import (``_require``),
  and the adapters the samplers share (``_Unit``, the finished and the tried trials);
* ``_gp_sampler``: :class:`GaussianProcessSampler` (``gp``) and ``_NamedConstraints``;
* ``_catcma_sampler``: :class:`CatCMASampler` (``catcma``) and its run state;
* ``_rfbo_sampler``: :class:`RandomForestSampler` (``rfbo``), its forest codec and gates.

Import from here; to patch a name in a test, patch it where it is defined (``_import`` in
``_extra_common``), since this facade only holds references.
"""

from __future__ import annotations

from optuna.samplers import BaseSampler

from autotune.errors import ConfigError
from autotune.study._catcma_sampler import (
    CMA_INCUMBENT_SHARE,
    CMA_REDRAWS,
    CMA_SIGMA0,
    CatCMASampler,
)
from autotune.study._extra_common import DISTRIBUTIONS, MODULES, STARTUP_TRIALS, _single_objective
from autotune.study._extra_common import _import as _import
from autotune.study._extra_common import _require as _require
from autotune.study._gp_sampler import GaussianProcessSampler
from autotune.study._gp_sampler import _named_only as _named_only
from autotune.study._rfbo_sampler import (
    RF_LOCAL_STARTS,
    RF_LOCAL_STEPS,
    RF_MAX_FEATURES,
    RF_MIN_SAMPLES_SPLIT,
    RF_NEIGHBOUR_SIGMA,
    RF_RANDOM_CANDIDATES,
    RF_RANDOM_EVERY,
    RF_TREES,
    Gates,
    RandomForestSampler,
)
from autotune.study._rfbo_sampler import _gates as _gates

__all__ = [
    "CMA_INCUMBENT_SHARE",
    "CMA_REDRAWS",
    "CMA_SIGMA0",
    "DISTRIBUTIONS",
    "EXTRA_SAMPLERS",
    "MODULES",
    "RF_LOCAL_STARTS",
    "RF_LOCAL_STEPS",
    "RF_MAX_FEATURES",
    "RF_MIN_SAMPLES_SPLIT",
    "RF_NEIGHBOUR_SIGMA",
    "RF_RANDOM_CANDIDATES",
    "RF_RANDOM_EVERY",
    "RF_TREES",
    "STARTUP_TRIALS",
    "CatCMASampler",
    "GaussianProcessSampler",
    "Gates",
    "RandomForestSampler",
    "make_extra_sampler",
]

EXTRA_SAMPLERS = ("gp", "catcma", "rfbo")


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
