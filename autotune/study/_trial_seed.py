"""Per-trial seeding: a seeded study proposes the same thing for trial N however it got there.

Optuna's samplers hold one random state, seeded once when the sampler is built. autotune
builds a sampler per ``autotune run`` process, so a seeded study that is resumed (Ctrl-C, a
lost machine, a study spread over several device sessions) starts that state again from the
seed and proposes the first run's configurations a second time: measured on the H200's
random-search arm (issue 28), every later ``autotune run --trials`` of
``studies/vllm-h200-dense-random.yaml`` (``seed: 28``) redrew the same six configurations,
duplicates that the runner reuses, and the study stopped finding anything new. Workers that
share a study file (so a seed) drew each other's configurations the same way.

:class:`TrialSeededSampler` wraps the sampler ``make_sampler`` built and, before each trial,
seeds every random state the sampler holds (and the samplers it holds) from
``(seed, trial number)``. What a trial draws then depends on the seed, its number and the
study's finished trials, never on how many trials this process asked before: a study run
in one go and the same study run in several pieces propose the same configurations, and
two workers (different trial numbers) draw different ones. The states are reseeded in
place, so objects that share one state (NSGA-II's child generation shares the sampler's)
keep sharing it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from autotune.study._optuna_compat import LazyRandomState, seed_lazy_random_state

MAX_DEPTH = 4
"""How far into a sampler's attributes random states are looked for (TPE's start-up random
sampler sits two levels under the default sampler)."""
_OWN_PACKAGES = ("optuna.", "autotune.")
_NOT_SAMPLER_STATE = ("optuna.study.", "optuna.storages.", "optuna.trial.", "optuna.distributions.")
"""A sampler that keeps a study or its storage around holds no random state of its own
there: not walked."""


def trial_seed(seed: int, number: int, index: int) -> int:
    """The seed of a trial's ``index``-th random state: independent streams per (seed,
    trial, state), within numpy's 0 .. 2**32 - 1."""
    return int(np.random.SeedSequence([seed, number, index]).generate_state(1)[0])


def _holders(obj: object, depth: int, seen: set[int]) -> Iterator[object]:
    """``obj`` and the objects of Optuna's and autotune's own classes it holds, depth first,
    each once (a cycle or a shared state is visited once)."""
    if id(obj) in seen or depth > MAX_DEPTH:
        return
    seen.add(id(obj))
    yield obj
    for value in list(vars(obj).values()) if hasattr(obj, "__dict__") else []:
        items = value if isinstance(value, list | tuple) else [value]
        for item in items:
            module = type(item).__module__ + "."
            if (
                module.startswith(_OWN_PACKAGES)
                and not module.startswith(_NOT_SAMPLER_STATE)
                and not isinstance(item, type)
            ):
                yield from _holders(item, depth + 1, seen)


def random_states(sampler: BaseSampler) -> list[object]:
    """Every random state ``sampler`` holds, in a stable order: Optuna's lazy states, numpy
    ``RandomState`` and ``Generator`` objects, in its attributes and its samplers'."""
    found: list[object] = []
    seen_states: set[int] = set()
    for holder in _holders(sampler, 0, set()):
        if isinstance(holder, LazyRandomState):  # each holder comes once; not its inner state
            found.append(holder)
            continue
        for value in vars(holder).values() if hasattr(holder, "__dict__") else []:
            is_state = isinstance(value, np.random.RandomState | np.random.Generator)
            if is_state and id(value) not in seen_states:
                seen_states.add(id(value))
                found.append(value)
    return found


def reseed(sampler: BaseSampler, seed: int, number: int) -> int:
    """Seed every random state of ``sampler`` for trial ``number``; how many there were.
    Looked up at every trial, not once: ``reseed_rng`` replaces some samplers' generators."""
    states = random_states(sampler)
    for index, state in enumerate(states):
        value = trial_seed(seed, number, index)
        if isinstance(state, LazyRandomState):
            seed_lazy_random_state(state, value)
        elif isinstance(state, np.random.RandomState):
            state.seed(value)
        elif isinstance(state, np.random.Generator):
            state.bit_generator.state = type(state.bit_generator)(value).state
    return len(states)


class TrialSeededSampler(BaseSampler):
    """``inner``, with its random states seeded from ``(seed, trial number)`` before each
    trial (see the module's docstring). Everything else is ``inner``'s: attributes it does
    not define are read from ``inner``."""

    def __init__(self, inner: BaseSampler, seed: int) -> None:
        self.inner = inner
        self.seed = seed

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes this wrapper lacks (``size`` of the grid sampler, ...).
        if name == "inner":  # not set yet (copy/pickle): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"TrialSeededSampler({self.inner!r}, seed={self.seed})"

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        reseed(self.inner, self.seed, trial.number)
        self.inner.before_trial(study, trial)

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return self.inner.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return self.inner.sample_relative(study, trial, search_space)

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self.inner.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        # Optuna calls this for n_jobs > 1 threads; the next trial reseeds from its number.
        self.inner.reseed_rng()


def unwrap(sampler: BaseSampler) -> BaseSampler:
    """The sampler under a :class:`TrialSeededSampler` (``sampler`` itself otherwise)."""
    return sampler.inner if isinstance(sampler, TrialSeededSampler) else sampler
