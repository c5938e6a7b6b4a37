"""The surfaces: what launching a configuration gives, each surface's space, evaluator and
exact optimum, and loading a surface by name."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any

from autotune.deployment import Deployment, load_deployment
from autotune.render import render
from autotune.sim import perf_model as pm
from autotune.sim.args import SimConfig, parse_config
from autotune.sim.levers import config_from_levers
from autotune.sim.optimum import search as sim_optimum
from autotune.space import SearchSpace, TrialConfig, load_space
from autotune.study.definition import SLOSettings, load_study_definition
from autotune.study.objectives import Objective

from .rules import split_rules, with_rules

REPO = Path(__file__).resolve().parents[2]
SURFACES_DIR = Path(__file__).resolve().parents[1] / "surfaces"
STUDY_FILE = REPO / "studies" / "dsv4-flash-sim.yaml"


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
    base, share = split_rules(name)
    gen = _generated(base)
    surface = surface_of(gen, objective=objective_kind)
    if share is None:
        return surface
    space, got = with_rules(
        gen.space_data,
        optimum=gen.optimum_config,
        share=share / 100,
        seed=gen.seed,
        file=f"{name}.yaml",
    )
    return dataclasses.replace(
        surface,
        name=name,
        space=space,
        description=f"{surface.description}; rules: {100 * got:.0f}% of random draws forbidden",
        needle_fraction=None,
    )


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
    """Surface names with ``family:N`` (``family:N:FIRST``, ``family:N:FIRST:rulesP``)
    replaced by the family's generated names (each ``-rulesP``: :mod:`.rules`)."""
    out: list[str] = []
    for name in names:
        if name.startswith("family:"):
            parts = name.split(":")
            rules = ""
            if parts[-1].startswith("rules"):  # family:N[:FIRST]:rulesP
                rules = "-" + parts.pop()
            if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts[1:]):
                raise SystemExit(f"bad surface {name!r}: family:N[:FIRST][:rulesP]")
            first = int(parts[2]) if len(parts) == 3 else 0
            out += [
                n + rules for n in generated_module().family_names(int(parts[1]), first_seed=first)
            ]
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
