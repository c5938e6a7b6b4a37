"""Sample efficiency and crash-awareness of the samplers, measured without servers.

Each run replays the tuning loop of ``autotune/study/runner.py`` on a pure function instead
of a deployment: real ``SearchSpace.suggest`` on real Optuna trials from the real
``make_sampler``; the baseline enqueued first; a forbidden proposal recorded infeasible and
never launched; an identical configuration reused, not launched; a launch that crashes or
serves wrong text completed with the runner's own failed values and constraints
(``autotune.trial.failed`` / ``reused_outcome`` of ``autotune.study.record``); every trial stored
by ``finish_trial``. The sampler therefore sees exactly what it sees in production, and
the true optimum of each surface is known, so "how many trials to get within 5% of it"
has an exact answer.

Surfaces:

* ``dsv4-sim``: the bundled study (``studies/dsv4-flash-sim.yaml``: C=16, 256 in / 128 out).
  Each configuration is rendered into the prefill and decode command lines and environments
  (``autotune.render``, the launcher's input) and parsed by the simulated servers' own
  parser (``autotune.sim.args.parse_config``); start-up failures (OOM, rejected arguments)
  and wrong text come from ``perf_model`` on those parsed configurations, throughput from
  ``perf_model.expectation`` (the servers' steady state; no noise unless ``--noise``).
  Optimum: ``autotune.sim.optimum.search`` (exact).
* ``gemm-kernel`` and ``vllm-serving``: ``benchmarks/surfaces/*.py`` + ``*.yaml``, synthetic
  surfaces with interacting and conditional parameters and crash regions, optimum by
  exhaustive enumeration.
* ``gen-<level>-<seed>`` (level ``easy``, ``medium``, ``hard`` or the ``heldout`` preset,
  optionally ``-up<k>`` engine upgrades): seeded generated surfaces,
  ``benchmarks/surfaces/generated.py``, with their exact optimum, needle fraction (share of
  random configurations within 5% of the optimum) and own heteroscedastic noise model
  (``--surface-noise``). ``--surfaces family:30`` is ``generated.family(30)``: ten of each
  level (``family:N:FIRST`` starts the seeds at FIRST).

Reported per surface and sampler, over the seeds: trials (and launches) to reach 90/95/99%
of the optimum (median [IQR] min-max; a seed that never got there counts as budget + 1,
"n/r"), the best found at 25/50/100/200 trials, launches, launches that crashed, forbidden
proposals (and how many were launched: must be 0), duplicates, sampler time per trial, and
two crash-awareness figures: "known-cause crash proposals", the share of proposals (after the
first crash) that crash the way an earlier launch already did (land in a crash region
already hit), and "near-crash repeats", launched crashes within one lever (``distance``) of
an earlier crash of the same cause. Random search's odds per trial are estimated by Monte
Carlo (``random_odds``) to give its expected trials to each level beyond the budget.

Usage (the defaults are the full run: every sampler, 20 seeds from 1000, 200 trials, all
three surfaces, two processes)::

    .venv/bin/python benchmarks/sample_efficiency.py --json reports/sample_efficiency.json
    .venv/bin/python benchmarks/sample_efficiency.py --samplers tpe,random --seeds 3 \
        --trials 100 --surfaces dsv4-sim
    .venv/bin/python benchmarks/sample_efficiency.py --samplers tpe,random --seeds 5 \
        --trials 100 --surfaces family:30 --surface-noise

Besides ``make_sampler``'s names: ``tpe-plain``, ``tpe-indep`` and ``tpe-mv`` (plain Optuna
TPE variants, ``build_sampler``); ``gp``, ``catcma`` and ``rfbo`` need their extras and are
not in the default list.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import multiprocessing
import os
import random
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import optuna

from autotune.deployment import Deployment, load_deployment
from autotune.render import render
from autotune.sim import perf_model as pm
from autotune.sim.args import SimConfig, parse_config
from autotune.sim.levers import config_from_levers
from autotune.sim.optimum import search as sim_optimum
from autotune.space import SearchSpace, TrialConfig, load_space
from autotune.space.model import FloatParam, IntParam
from autotune.space.params import ParamInfo
from autotune.study.definition import OBJECTIVES, SLOSettings, load_study_definition
from autotune.study.objectives import Objective
from autotune.study.record import finish_trial, reused_outcome  # noqa: E402
from autotune.study.samplers import make_sampler
from autotune.trial import TrialOutcome, TrialRecord, failed  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SURFACES_DIR = Path(__file__).resolve().parent / "surfaces"
STUDY_FILE = REPO / "studies" / "dsv4-flash-sim.yaml"
ALL_SURFACES = ("dsv4-sim", "gemm-kernel", "vllm-serving")
ALL_SAMPLERS = ("tpe", "tpe-plain", "random", "grid", "qmc", "nsga2")
LEVELS = (0.90, 0.95, 0.99)
CHECKPOINTS = (25, 50, 100, 200)
NEAR = 1
"""A proposal is near a known crash when at most this many levers differ (see ``distance``)."""
NUMERIC_CELLS = 8
"""Numeric values closer than 1/NUMERIC_CELLS of their (log) range count as the same lever
value in ``distance``."""


# ---------------------------------------------------------------------------- surfaces


@dataclass(frozen=True)
class Launch:
    """What launching one configuration gives: a failure class or the measured figures."""

    failure: str | None = None
    reason: str = ""
    throughput: float = 0.0
    tpot_ms: float | None = None


@dataclass
class Surface:
    """A search space, a pure evaluator of launched configurations and its exact optimum."""

    name: str
    space: SearchSpace
    objective: Objective
    evaluate: Callable[[TrialConfig], Launch]
    optimum: float
    optimum_config: dict[str, Any]
    description: str = ""
    fast_evaluate: Callable[[TrialConfig], Launch] | None = None
    """Same answers as ``evaluate``, faster (``random_odds`` draws tens of thousands)."""
    noise_sigma: Callable[[TrialConfig], float] | None = None
    """The surface's own lognormal sigma per configuration (generated surfaces; used with
    ``run_one(surface_noise=True)``)."""
    level: str | None = None
    """Difficulty level of a generated surface."""
    needle_fraction: float | None = None
    """Exact share of random configurations within 5% of the optimum (generated)."""


def _server_config(spec_argv: Sequence[str], env: Mapping[str, str]) -> SimConfig:
    """What one simulated server parses from its rendered command line and environment."""
    argv = list(spec_argv)
    start = argv.index("autotune.sim.server") + 1
    return parse_config(argv[start:], env)


class SimEvaluator:
    """The bundled simulated deployment as a pure function of a trial configuration.

    The same path as a real trial up to the servers' argument parsing: ``render`` the
    services, parse each server's argv + env like the server does, then ask the
    performance model what that server does (start-up failure, wrong text, speed).
    """

    def __init__(
        self,
        space: SearchSpace,
        deployment: Deployment,
        *,
        concurrency: int,
        input_len: int,
        output_len: int,
    ) -> None:
        self.space = space
        self.deployment = deployment
        self.load = {"concurrency": concurrency, "input_len": input_len, "output_len": output_len}
        self.run_dir = Path("/tmp/autotune-sample-efficiency")

    def server_configs(self, config: TrialConfig) -> tuple[SimConfig, SimConfig]:
        specs = render(self.space, self.deployment, config, run_dir=self.run_dir)
        pre = _server_config(specs["prefill"].argv, specs["prefill"].env)
        dec = _server_config(specs["decode"].argv, specs["decode"].env)
        return pre, dec

    def __call__(self, config: TrialConfig) -> Launch:
        pre, dec = self.server_configs(config)
        # The model's PD view: prefill levers from the prefill server, the rest from decode.
        merged = dataclasses.replace(
            dec,
            disaggregation_mode="null",
            chunked_prefill_size=pre.chunked_prefill_size,
            port=0,
            cuda_visible_devices=None,
            sim_time_scale=1.0,
        )
        return self._score(pre, dec, merged)

    def _score(self, pre: SimConfig, dec: SimConfig, merged: SimConfig) -> Launch:
        for server in (pre, dec):
            failure = pm.startup_failure(server)
            if failure is not None:
                last = failure.lines[-1] if failure.lines else ""
                return Launch(failure=failure.kind, reason=f"{server.disaggregation_mode}: {last}")
        if pm.serves_wrong_text(dec):  # the decode server writes the text
            return Launch(failure="wrong_output", reason="greedy output differs")
        # the prefill server as it parsed its own flags (its speculative settings count)
        prefill = dataclasses.replace(pre, sim_time_scale=1.0)
        exp = pm.expectation(merged, prefill=prefill, **self.load, deployment="pd")  # type: ignore[arg-type]
        return Launch(throughput=exp.output_throughput, tpot_ms=1000.0 * exp.tpot_s)

    def fast(self, config: TrialConfig) -> Launch:
        """The same through ``levers.config_from_levers`` (no rendering, no parsing; the
        space's parameter names are the levers of the contract)."""
        levers = dict(config)
        return self._score(
            config_from_levers(levers, mode="prefill"),
            config_from_levers(levers, mode="decode"),
            config_from_levers(levers),
        )


def _sim_surface(objective_kind: str) -> Surface:
    definition = load_study_definition(STUDY_FILE)
    space = load_space(definition.resolve(definition.space))
    deployment = load_deployment(definition.resolve(definition.deployment))
    load = definition.load
    evaluator = SimEvaluator(
        space,
        deployment,
        concurrency=load.concurrency,
        input_len=load.input_len,
        output_len=load.output_len,
    )
    best = _sim_true_optimum(load.concurrency, load.input_len, load.output_len)
    return Surface(
        name="dsv4-sim",
        space=space,
        objective=Objective(kind=objective_kind, slo=definition.slo),
        evaluate=evaluator,
        fast_evaluate=evaluator.fast,
        optimum=best[0],
        optimum_config=best[1],
        description=(
            f"bundled simulated deployment, C={load.concurrency}, "
            f"{load.input_len} in / {load.output_len} out"
        ),
    )


@lru_cache(maxsize=4)
def _sim_true_optimum(concurrency: int, input_len: int, output_len: int) -> tuple[float, dict]:
    found = sim_optimum(concurrency=concurrency, input_len=input_len, output_len=output_len)
    return found.throughput, dict(found.levers)


def _load_module(name: str) -> ModuleType:
    path = SURFACES_DIR / f"{name.replace('-', '_')}.py"
    if not path.is_file():
        raise SystemExit(f"unknown surface {name!r} (no {path})")
    spec = importlib.util.spec_from_file_location(f"surfaces_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@lru_cache(maxsize=8)
def _synthetic_optimum(name: str) -> tuple[float, dict]:
    module = _load_module(name)
    value, config = module.true_optimum()
    return float(value), dict(config)


def _synthetic_surface(name: str, objective_kind: str) -> Surface:
    module = _load_module(name)
    space = load_space(SURFACES_DIR / f"{name.replace('-', '_')}.yaml")

    def evaluate(config: TrialConfig) -> Launch:
        result = module.evaluate(config)
        if result.failure is not None:
            return Launch(failure=result.failure, reason=result.reason)
        return Launch(throughput=result.value, tpot_ms=result.latency_ms)

    value, config = _synthetic_optimum(name)
    return Surface(
        name=name,
        space=space,
        objective=Objective(kind=objective_kind, slo=SLOSettings()),
        evaluate=evaluate,
        optimum=value,
        optimum_config=config,
        description=module.__doc__.strip().splitlines()[0] if module.__doc__ else "",
        noise_sigma=getattr(module, "noise_sigma", None),
    )


@lru_cache(maxsize=1)
def generated_module() -> ModuleType:
    """``benchmarks/surfaces/generated.py``, loaded once (its classes stay the same)."""
    return _load_module("generated")


@lru_cache(maxsize=128)
def _generated(name: str) -> Any:
    return generated_module().by_name(name)


def _generated_surface(name: str, objective_kind: str) -> Surface:
    return surface_of(_generated(name), objective=objective_kind)


def surface_of(gen: Any, *, objective: str = "throughput") -> Surface:
    """A ``GeneratedSurface`` (``generate``, ``perturb``) as the harness's :class:`Surface`."""

    def evaluate(config: TrialConfig) -> Launch:
        result = gen.evaluate(config)
        if result.failure is not None:
            return Launch(failure=result.failure, reason=result.reason)
        return Launch(throughput=result.value, tpot_ms=result.latency_ms)

    return Surface(
        name=gen.name,
        space=gen.space,
        objective=Objective(kind=objective, slo=SLOSettings()),
        evaluate=evaluate,
        optimum=gen.optimum,
        optimum_config=dict(gen.optimum_config),
        description=gen.description,
        noise_sigma=gen.noise_sigma,
        level=gen.level,
        needle_fraction=gen.needle_fraction,
    )


def expand_surfaces(names: Sequence[str]) -> list[str]:
    """Surface names with ``family:N`` (``family:N:FIRST``) replaced by the family's
    generated names."""
    out: list[str] = []
    for name in names:
        if name.startswith("family:"):
            parts = name.split(":")
            if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts[1:]):
                raise SystemExit(f"bad surface {name!r}: family:N or family:N:FIRST")
            first = int(parts[2]) if len(parts) == 3 else 0
            out += generated_module().family_names(int(parts[1]), first_seed=first)
        else:
            out.append(name)
    return out


def load_surface(name: str, *, objective: str = "throughput") -> Surface:
    """A surface by name; ``objective`` as in a study file."""
    if name == "dsv4-sim":
        return _sim_surface(objective)
    if name.startswith("gen-"):
        return _generated_surface(name, objective)
    return _synthetic_surface(name, objective)


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
    """``make_sampler``, plus ``tpe-plain``, ``tpe-indep`` and ``tpe-mv``."""
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


# ---------------------------------------------------------------------------- summaries


def trials_to(run: Run, level: float, optimum: float) -> int | None:
    """First trial (1-based, the baseline is trial 1) whose incumbent is within ``level``
    of the optimum; None when the run never got there."""
    for i, value in enumerate(run.incumbent):
        if value >= level * optimum * (1 - 1e-9):
            return i + 1
    return None


def launches_to(run: Run, level: float, optimum: float) -> int | None:
    """Launches (restarts) spent until ``trials_to``: forbidden and duplicate trials are free."""
    reached = trials_to(run, level, optimum)
    if reached is None:
        return None
    return sum(1 for k in run.kinds[:reached] if k == "launch")


def best_at(run: Run, n: int, optimum: float) -> float | None:
    """Incumbent after ``n`` trials, in % of the optimum (None past the run's length)."""
    if n > len(run.incumbent):
        return None
    return 100.0 * run.incumbent[n - 1] / optimum


def _spread(values: Sequence[float]) -> dict[str, float]:
    arr = np.asarray(values, dtype=float)
    return {
        "median": float(np.median(arr)),
        "q1": float(np.percentile(arr, 25)),
        "q3": float(np.percentile(arr, 75)),
        "min": float(arr.min()),
        "max": float(arr.max()),
    }


def summarize(runs: Sequence[Run], optimum: float) -> dict[str, Any]:
    """Figures over the seeds of one (surface, sampler). A seed that never reached a level
    counts as budget + 1 trials (so a median above the budget reads "> budget")."""
    budget = len(runs[0].incumbent)
    out: dict[str, Any] = {"seeds": len(runs), "trials": budget}
    for level in LEVELS:
        reached = [trials_to(r, level, optimum) for r in runs]
        launches = [launches_to(r, level, optimum) for r in runs]
        out[f"to_{round(level * 100)}"] = {
            **_spread([budget + 1 if n is None else n for n in reached]),
            "not_reached": sum(n is None for n in reached),
            "launches": _spread([budget + 1 if n is None else n for n in launches]),
        }
    out["best_at"] = {
        str(n): _spread([best_at(r, n, optimum) or 0.0 for r in runs])
        for n in CHECKPOINTS
        if n <= budget
    }
    counts: dict[str, list[float]] = {
        k: [] for k in ("forbidden", "duplicates", "launches", "crashes", "near_crash")
    }
    known = proposals = 0
    causes: dict[str, int] = {}
    for r in runs:
        launched = [i for i, k in enumerate(r.kinds) if k == "launch"]
        crashes = [i for i in launched if r.failures[i] is not None]
        counts["forbidden"].append(r.kinds.count("forbidden"))
        counts["duplicates"].append(r.kinds.count("duplicate"))
        counts["launches"].append(len(launched))
        counts["crashes"].append(len(crashes))
        counts["near_crash"].append(sum(r.near_crash))
        first = crashes[0] if crashes else len(r.kinds)
        after = [i for i in range(first + 1, len(r.kinds)) if r.kinds[i] != "forbidden"]
        proposals += len(after)
        known += sum(r.known_cause[i] for i in after)
        for i in crashes:
            cause = r.failures[i] or "?"
            causes[cause] = causes.get(cause, 0) + 1
    out["mean"] = {k: float(np.mean(v)) for k, v in counts.items()}
    out["crash_causes"] = causes
    out["known_cause_share"] = known / proposals if proposals else 0.0
    out["crash_share"] = sum(counts["crashes"]) / max(1.0, sum(counts["launches"]))
    out["forbidden_launched"] = sum(r.forbidden_launched for r in runs)
    tail = [ms for r in runs for ms in r.sampler_ms[max(0, budget - 20) :]]
    out["sampler_ms_last20"] = {"mean": float(np.mean(tail)), "p95": float(np.percentile(tail, 95))}
    out["sampler_ms_mean"] = float(np.mean([ms for r in runs for ms in r.sampler_ms]))
    out["seconds_per_run"] = float(np.mean([r.seconds for r in runs]))
    return out


def random_odds(surface: Surface, *, draws: int, seed: int = 0) -> dict[str, float]:
    """P(one random-search trial is within 90/95/99% of the optimum), by Monte Carlo over
    ``SearchSpace.random_config`` (RandomSampler's distribution; forbidden draws count as
    misses), and the median trials random search needs: 1 + ln 0.5 / ln(1 - p)."""
    rng = random.Random(seed)
    score = surface.fast_evaluate or surface.evaluate
    hits = dict.fromkeys(LEVELS, 0)
    for i in range(draws):
        config = surface.space.random_config(rng)
        if surface.space.violations(config):
            continue
        launch = score(config)
        if i < 200 and score is not surface.evaluate and surface.evaluate(config) != launch:
            raise AssertionError(f"fast and full evaluation differ on {config}")
        if launch.failure is None:
            for level in LEVELS:
                hits[level] += launch.throughput >= level * surface.optimum * (1 - 1e-9)
    out: dict[str, float] = {"draws": float(draws)}
    for level in LEVELS:
        p = hits[level] / draws
        name = str(round(level * 100))
        out[f"p{name}"] = p
        out[f"median_trials_{name}"] = (
            1.0 + math.ceil(math.log(0.5) / math.log(1.0 - p)) if 0 < p < 1 else math.inf
        )
    return out


# ---------------------------------------------------------------------------- driver


def _task(args: tuple[str, str, int, int, float, str, bool]) -> dict[str, Any]:
    surface_name, sampler, seed, trials, noise, objective, surface_noise = args
    warnings.simplefilter("ignore")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    surface = load_surface(surface_name, objective=objective)
    run = run_one(surface, sampler, seed, trials, noise=noise, surface_noise=surface_noise)
    return dataclasses.asdict(run)


def run_all(
    surfaces: Sequence[str],
    samplers: Sequence[str],
    seeds: Sequence[int],
    trials: int,
    *,
    noise: float = 0.0,
    surface_noise: bool = False,
    objective: str = "throughput",
    workers: int = 1,
) -> dict[str, dict[str, list[Run]]]:
    """Every (surface, sampler, seed) run, over ``workers`` processes."""
    for name in surfaces:  # optima once, in the parent (forked workers inherit the caches)
        load_surface(name, objective=objective)
    tasks = [
        (s, p, seed, trials, noise, objective, surface_noise)
        for s in surfaces
        for p in samplers
        for seed in seeds
    ]
    slow = ("gp", "rfbo", "tpe", PLAIN_TPE, MULTIVARIATE_TPE, "nsga2")
    tasks.sort(key=lambda t: slow.index(t[1]) if t[1] in slow else len(slow))  # slow first
    if workers > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            results = pool.map(_task, tasks, chunksize=1)
    else:
        results = [_task(t) for t in tasks]
    out: dict[str, dict[str, list[Run]]] = {s: {p: [] for p in samplers} for s in surfaces}
    for res in results:
        out[res["surface"]][res["sampler"]].append(Run(**res))
    for by_sampler in out.values():
        for runs in by_sampler.values():
            runs.sort(key=lambda r: r.seed)
    return out


def build_report(
    runs: Mapping[str, Mapping[str, list[Run]]],
    *,
    trials: int,
    seeds: Sequence[int],
    noise: float,
    objective: str,
    odds_draws: int,
    surface_noise: bool = False,
) -> dict[str, Any]:
    """Everything ``--json`` writes: per surface, the optimum, random search's odds and the
    summary of every sampler (and, for generated surfaces, the level and needle fraction)."""
    report: dict[str, Any] = {
        "trials": trials,
        "seeds": list(seeds),
        "noise": noise,
        "surface_noise": surface_noise,
        "objective": objective,
        "surfaces": {},
    }
    for name, by_sampler in runs.items():
        surface = load_surface(name, objective=objective)
        report["surfaces"][name] = {
            "optimum": surface.optimum,
            "optimum_config": surface.optimum_config,
            "description": surface.description,
            "level": surface.level,
            "needle_fraction": surface.needle_fraction,
            "random_odds": random_odds(surface, draws=odds_draws) if odds_draws else {},
            "samplers": {s: summarize(rs, surface.optimum) for s, rs in by_sampler.items() if rs},
        }
    return report


def _n(x: float, budget: int) -> str:
    return f">{budget}" if x > budget else f"{x:.0f}"


def _trials_cell(q: Mapping[str, Any], budget: int) -> str:
    text = f"{_n(q['median'], budget)} [{_n(q['q1'], budget)}-{_n(q['q3'], budget)}]"
    text += f" {_n(q['min'], budget)}-{_n(q['max'], budget)}"
    return text + (f" ({q['not_reached']} n/r)" if q["not_reached"] else "")


def markdown(report: Mapping[str, Any]) -> str:
    """The report as markdown tables (what BENCHMARKS.md quotes)."""
    budget = int(report["trials"])
    marks = [n for n in CHECKPOINTS if n <= budget]
    lines: list[str] = []
    for name, info in report["surfaces"].items():
        about = info["description"]
        if info.get("level") is not None:
            about = (
                f"{info['level']}, needle fraction {100 * info['needle_fraction']:.3g}%: " + about
            )
        lines += [f"#### {name}: optimum {info['optimum']:,.1f} ({about})", ""]
        lines += [
            "| sampler | trials to 90% | trials to 95% | trials to 99% | launches to 95% |",
            "|---|---|---|---|---|",
        ]
        for sampler, s in info["samplers"].items():
            lines.append(
                f"| {sampler} | {_trials_cell(s['to_90'], budget)} | "
                f"{_trials_cell(s['to_95'], budget)} | {_trials_cell(s['to_99'], budget)} | "
                f"{_n(s['to_95']['launches']['median'], budget)} |"
            )
        odds = info.get("random_odds") or {}
        if odds:
            lines.append(
                f"| random, expected (p per trial, {int(odds['draws']):,} draws) | "
                + " | ".join(
                    f"{odds[f'median_trials_{lv}']:.0f} (p={100 * odds[f'p{lv}']:.2f}%)"
                    for lv in ("90", "95", "99")
                )
                + " | |"
            )
        lines += ["", "| sampler | " + " | ".join(f"best @{n}" for n in marks) + " |"]
        lines.append("|---|" + "---|" * len(marks))
        for sampler, s in info["samplers"].items():
            cells = [
                f"{s['best_at'][str(n)]['median']:.1f}% ({s['best_at'][str(n)]['min']:.0f}-"
                f"{s['best_at'][str(n)]['max']:.0f})"
                for n in marks
            ]
            lines.append(f"| {sampler} | " + " | ".join(cells) + " |")
        lines += [
            "",
            "| sampler | launches | crashed (wasted) | crash share | known-cause crash "
            "proposals | near-crash repeats | forbidden proposed / launched | duplicates | "
            "ask+suggest ms (last 20) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for sampler, s in info["samplers"].items():
            m = s["mean"]
            lines.append(
                f"| {sampler} | {m['launches']:.1f} | {m['crashes']:.1f} | "
                f"{100 * s['crash_share']:.1f}% | {100 * s['known_cause_share']:.1f}% | "
                f"{m['near_crash']:.1f} | {m['forbidden']:.1f} / {s['forbidden_launched']} | "
                f"{m['duplicates']:.1f} | {s['sampler_ms_last20']['mean']:.1f} |"
            )
        lines.append("")
    return "\n".join(lines)


def verdicts(report: Mapping[str, Any], *, default: str = "tpe") -> list[str]:
    """The issue's targets for the default sampler, one line each."""
    budget = int(report["trials"])
    out = []
    for name, info in report["surfaces"].items():
        samplers = info["samplers"]
        if default not in samplers:
            continue
        mine = samplers[default]["to_95"]["median"]
        line = f"{name}: default median trials to 95% = {_n(mine, budget)}"
        if "random" in samplers:
            theirs = samplers["random"]["to_95"]["median"]
            expected = (info.get("random_odds") or {}).get("median_trials_95")
            ratio = theirs / mine
            bound = ">=" if theirs > budget else "="
            line += f"; random {_n(theirs, budget)} -> ratio {bound} {ratio:.1f}x"
            if expected is not None and math.isfinite(expected):
                line += f" (random expected {expected:.0f} -> {expected / mine:.1f}x)"
        out.append(line)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samplers", default=",".join(ALL_SAMPLERS))
    parser.add_argument("--seeds", type=int, default=20, help="how many seeds")
    parser.add_argument("--first-seed", type=int, default=1000, help="seeds start here")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--surfaces", default=",".join(ALL_SURFACES))
    parser.add_argument("--noise", type=float, default=0.0, help="lognormal sigma on the score")
    parser.add_argument(
        "--surface-noise",
        action="store_true",
        help="generated surfaces use their own per-configuration sigma instead of --noise",
    )
    parser.add_argument("--objective", default="throughput", choices=OBJECTIVES)
    parser.add_argument("--odds-draws", type=int, default=20000, help="random search odds")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    args = parser.parse_args(argv)
    samplers = [s for s in args.samplers.split(",") if s]
    surfaces = expand_surfaces([s for s in args.surfaces.split(",") if s])
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    started = time.perf_counter()
    runs = run_all(
        surfaces,
        samplers,
        seeds,
        args.trials,
        noise=args.noise,
        surface_noise=args.surface_noise,
        objective=args.objective,
        workers=args.workers,
    )
    report = build_report(
        runs,
        trials=args.trials,
        seeds=seeds,
        noise=args.noise,
        objective=args.objective,
        odds_draws=args.odds_draws,
        surface_noise=args.surface_noise,
    )
    report["wall_seconds"] = time.perf_counter() - started
    report["command"] = " ".join(["benchmarks/sample_efficiency.py", *(argv or sys.argv[1:])])
    report["verdicts"] = verdicts(report)
    print(markdown(report))
    print("\n".join(report["verdicts"]))
    print(f"wall: {report['wall_seconds']:.0f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
