"""The loop: one sampler on one surface for one seed, as the runner does it, and what
happened at every trial."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna

from autotune.space import SearchSpace, TrialConfig
from autotune.space.model import FloatParam, IntParam
from autotune.space.params import ParamInfo
from autotune.study.record import finish_trial, reused_outcome
from autotune.study.samplers import LocalTPESampler, TrialSeededSampler, make_sampler
from autotune.trial import TrialOutcome, TrialRecord, failed

from .surfaces import Launch, Surface

NEAR = 1
"""A proposal is near a known crash when at most this many levers differ (see ``distance``)."""
NUMERIC_CELLS = 8
"""Numeric values closer than 1/NUMERIC_CELLS of their (log) range count as the same lever
value in ``distance``."""


# ---------------------------------------------------------------------------- the loop


def _metrics(launch: Launch) -> dict[str, Any]:
    """The loadgen metrics the objective reads, for a healthy launch."""
    tpot = launch.tpot_ms
    return {
        "output_throughput": launch.throughput,
        "tpot_ms": {"p99": tpot} if tpot is not None and math.isfinite(tpot) else {},
        "error_rate": 0.0,
    }


def _position(param: ParamInfo, value: Any) -> float:
    """Where a numeric value sits in its range, 0..1 (log scale when the parameter is)."""
    spec = param.spec
    assert isinstance(spec, (IntParam, FloatParam))
    low, high, x = float(spec.low), float(spec.high), float(value)
    if spec.log:
        low, high, x = math.log(low), math.log(high), math.log(x)
    return 0.0 if high == low else (x - low) / (high - low)


def distance(space: SearchSpace, a: Mapping[str, Any], b: Mapping[str, Any]) -> int:
    """How many levers differ between two configurations (Hamming distance).

    Over the sampled parameters; one active in a configuration and not in the other
    differs; numeric values count as the same lever value when they are within
    1/NUMERIC_CELLS of their (log) range of each other.
    """
    d = 0
    for param in space.sampled_params:
        va, vb = a.get(param.name), b.get(param.name)
        if va is None or vb is None:
            d += (va is None) != (vb is None)
        elif param.choices is not None:
            d += va != vb
        else:
            d += abs(_position(param, va) - _position(param, vb)) > 1.0 / NUMERIC_CELLS
    return d


@dataclass
class Run:
    """One sampler, one seed, one surface: what happened at every trial."""

    surface: str
    sampler: str
    seed: int
    kinds: list[str] = field(default_factory=list)  # forbidden | duplicate | launch
    failures: list[str | None] = field(default_factory=list)
    true_values: list[float] = field(default_factory=list)  # 0 for failures
    incumbent: list[float] = field(default_factory=list)  # true value of the tuner's best
    sampler_ms: list[float] = field(default_factory=list)  # ask + suggest
    known_cause: list[bool] = field(default_factory=list)  # crashed the way an earlier one did
    near_crash: list[bool] = field(default_factory=list)  # ... within NEAR levers of it
    observed: list[float] = field(default_factory=list)  # what a launch measured (0: none)
    sigmas: list[float] = field(default_factory=list)  # noise of a launch's measurement
    configs: list[dict[str, Any]] = field(default_factory=list)  # what each trial proposed
    forbidden_launched: int = 0
    seconds: float = 0.0


SamplerFactory = Callable[..., optuna.samplers.BaseSampler]
PLAIN_TPE = "tpe-plain"
"""Benchmark-only name: the default before this change (multivariate grouped TPE, 10 random
start-up trials), kept to show what the local moves and guards buy."""
INDEPENDENT_TPE = "tpe-indep"
"""Benchmark-only name: Optuna's TPE with one independent model per parameter (Optuna 5's
``TPESampler()`` is multivariate for one objective, so ``multivariate=False`` is explicit)."""
MULTIVARIATE_TPE = "tpe-mv"
"""Benchmark-only name: multivariate grouped TPE with Optuna's defaults, no local moves. With
Optuna 5.0's defaults (10 start-up trials, constant liar) this is ``tpe-plain``'s sampler:
the same seed gives the same run."""
LAUNCH_STARTUP_TPE = "tpe-launch-startup"
"""Benchmark-only name: the default sampler with its start-up counted in launches, forbidden
and reused trials left out (measured, not adopted: ``autotune.study.hints.STARTUP_COUNTS``)."""
EXTRA_SAMPLERS = ("gp", "catcma", "rfbo")
"""``make_sampler``'s samplers that need an extra (``pip install 'autotune[gp]'``, ...); not
in the default ``--samplers`` (``gp`` takes seconds per trial)."""


def build_sampler(
    name: str,
    *,
    seed: int,
    grid: Mapping[str, Sequence[Any]] | None = None,
    multi_objective: bool = False,
) -> optuna.samplers.BaseSampler:
    """``make_sampler``, plus ``tpe-plain``, ``tpe-indep``, ``tpe-mv`` and
    ``tpe-launch-startup``."""
    if name == LAUNCH_STARTUP_TPE:
        return TrialSeededSampler(LocalTPESampler(seed=seed, startup_counts="launches"), seed)
    if name == PLAIN_TPE:
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, group=True, constant_liar=True, n_startup_trials=10
        )
    if name == INDEPENDENT_TPE:
        return optuna.samplers.TPESampler(seed=seed, multivariate=False)
    if name == MULTIVARIATE_TPE:
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True)
    return make_sampler(name, seed=seed, grid=grid, multi_objective=multi_objective)


def run_one(
    surface: Surface,
    sampler_name: str,
    seed: int,
    trials: int,
    *,
    noise: float = 0.0,
    surface_noise: bool = False,
    sigma: Callable[[TrialConfig], float] | None = None,
    factory: SamplerFactory | None = None,
    on_study: Callable[[optuna.Study], None] | None = None,
) -> Run:
    """Replay ``Tuner.run`` (ask -> forbidden -> duplicate -> launch -> finish_trial).

    ``noise`` is the lognormal sigma of every measurement; with ``surface_noise`` a surface
    that has its own noise model (``Surface.noise_sigma``, generated surfaces) uses that
    per configuration instead; ``sigma(config)``, when given, overrides both.
    ``on_study`` is called once the study holds its enqueued baseline, before the first
    trial (``benchmarks/warm_start.py`` applies a warm start there, as the runner does);
    trials it adds as finished are not counted as trials of the run."""
    started = time.perf_counter()
    objective = surface.objective
    space = surface.space
    build = factory or build_sampler
    sampler = build(
        sampler_name,
        seed=seed,
        grid=space.grid() if sampler_name == "grid" else None,
        multi_objective=len(objective.directions) > 1,
    )
    study = optuna.create_study(directions=objective.directions, sampler=sampler)
    study.set_metric_names(objective.metric_names)
    study.enqueue_trial(space.baseline_params(), user_attrs={"is_baseline": True})
    if on_study is not None:
        on_study(study)
    rng = np.random.default_rng([seed, 7919])
    known: dict[str, int] = {}
    true_by_number: dict[int, float] = {}
    crashed: dict[str, list[dict[str, Any]]] = {}  # failure class -> configs that crashed
    launched: list[TrialConfig] = []  # everything handed to the evaluator
    run = Run(surface=surface.name, sampler=sampler_name, seed=seed)
    best_observed = -math.inf
    best_true = 0.0
    for _ in range(trials):
        t0 = time.perf_counter()
        trial = study.ask()
        config = space.suggest(trial)
        run.sampler_ms.append(1000.0 * (time.perf_counter() - t0))
        attrs: dict[str, Any] = {
            "config": config,
            "is_baseline": bool(trial.user_attrs.get("is_baseline", False)),
            "failure": None,
            "reason": None,
            "reused_from": None,
            "phase_seconds": {"restart": 0.0, "warmup": 0.0, "measure": 0.0},
        }
        key = space.config_key(config)
        violations = space.violations(config)
        near = False
        true_value = observed_value = sd = 0.0
        failure: str | None = None
        if violations:  # runner step 2: never launched, infeasible
            kind = "forbidden"
            reason = "; ".join(f"{v.name}: {v.reason}" for v in violations)
            outcome = failed(
                objective, TrialRecord.from_attrs(attrs), failure="forbidden", reason=reason
            )
        elif key in known:  # runner step 3: the earlier result, nothing launched
            kind = "duplicate"
            outcome = reused_outcome(
                study, known[key], TrialRecord.from_attrs(attrs), objective=objective
            )
            failure = outcome.attrs.get("failure")
            true_value = true_by_number[known[key]]
        else:  # launch
            kind = "launch"
            launched.append(config)
            launch = surface.evaluate(config)
            if launch.failure is not None:
                failure = launch.failure
                same = crashed.setdefault(failure, [])
                near = any(distance(space, config, c) <= NEAR for c in same)
                same.append(config)
                outcome = failed(
                    objective, TrialRecord.from_attrs(attrs), failure=failure, reason=launch.reason
                )
            else:
                true_value = launch.throughput
                metrics = _metrics(launch)
                sd = noise
                if sigma is not None:
                    sd = sigma(config)
                elif surface_noise and surface.noise_sigma is not None:
                    sd = surface.noise_sigma(config)
                if sd > 0:
                    metrics["output_throughput"] = true_value * math.exp(rng.normal(0.0, sd))
                observed_value = float(metrics["output_throughput"])
                attrs["phase_seconds"]["restart"] = 1.0
                outcome = TrialOutcome(
                    values=objective.values(metrics),
                    constraints=objective.constraints(metrics),
                    record=TrialRecord.from_attrs(attrs),
                )
        finish_trial(study, trial, outcome, constraint_keys=objective.constraint_keys)
        if outcome.attrs.get("reused_from") is None:
            known.setdefault(key, trial.number)
        observed = outcome.values[0] if outcome.feasible else -math.inf
        if observed > best_observed:
            best_observed = observed
            best_true = true_value
        seen_before = len(crashed.get(failure or "", ())) > (1 if kind == "launch" else 0)
        run.kinds.append(kind)
        run.failures.append("forbidden" if kind == "forbidden" else failure)
        run.true_values.append(true_value)
        true_by_number[trial.number] = true_value
        run.incumbent.append(best_true)
        run.known_cause.append(kind != "forbidden" and failure is not None and seen_before)
        run.near_crash.append(near)
        run.observed.append(observed_value)
        run.sigmas.append(sd)
        run.configs.append(dict(config))
    run.forbidden_launched = sum(1 for c in launched if space.violations(c))
    run.seconds = time.perf_counter() - started
    return run
