"""Dry runs: render configurations into command lines and check them, launching nothing.

``autotune space render`` prints what a trial would start; ``autotune space check`` renders
the baseline and sampled configurations against a deployment and reads every command with
the rules of the engine's real parser (its manifest): an unknown option, an abbreviation, an
ambiguous prefix, a value outside the choices. A problem is reported once, with the file and
field it comes from (the space parameter that emitted the option, or the deployment's command),
the option, the closest real options and how many of the rendered configurations hit it.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.deployment import Deployment
from autotune.engines import BaseEngine, CommandProblem, engine_for_command, get_engine
from autotune.engines._manifest import split_value
from autotune.render import render
from autotune.space import SearchSpace, TrialConfig
from autotune.space.targets import owned_env, owned_flags
from autotune.specs import ServiceSpec

DEFAULT_SAMPLES = 200


@dataclass(frozen=True)
class RenderedConfig:
    """One configuration and the services it starts."""

    label: str
    config: TrialConfig
    specs: dict[str, ServiceSpec]

    def as_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "config": dict(self.config),
            "services": {
                name: {
                    "argv": list(spec.argv),
                    "env": dict(sorted(spec.env.items())),
                    "unset_env": list(spec.unset_env),
                    "command_line": spec.command_line(),
                }
                for name, spec in self.specs.items()
            },
        }

    def as_text(self) -> str:
        lines = [f"# {self.label}: " + " ".join(f"{k}={v}" for k, v in self.config.items())]
        for name, spec in self.specs.items():
            lines.append(f"[{name}]")
            lines.append(f"  {spec.command_line()}")
        return "\n".join(lines)


@dataclass
class Finding:
    """A problem of the rendered commands, counted over the configurations that hit it."""

    file: str
    field: str
    service: str
    problem: CommandProblem
    engine: str
    configs: list[str] = dataclasses.field(default_factory=list)

    @property
    def severity(self) -> str:
        return self.problem.severity

    def __str__(self) -> str:
        where = f"{self.file}: field '{self.field}' (service {self.service})"
        count = len(self.configs)
        seen = f"; in {count} rendered config{'s' if count != 1 else ''} (e.g. {self.configs[0]})"
        return f"{self.severity}: {where}: {self.problem}{seen}"


def sample_configs(space: SearchSpace, *, n: int, seed: int) -> list[TrialConfig]:
    """``n`` random configurations that a study could launch (no forbidden combination),
    reproducible from ``seed``."""
    rng = random.Random(seed)
    return [space.random_config(rng, avoid_forbidden=True) for _ in range(n)]


def render_configs(
    space: SearchSpace,
    deployment: Deployment,
    configs: Iterable[tuple[str, TrialConfig]],
    *,
    run_dir: str | Path | None = None,
) -> list[RenderedConfig]:
    return [
        RenderedConfig(label, config, render(space, deployment, config, run_dir=run_dir))
        for label, config in configs
    ]


class CommandChecker:
    """Checks rendered services: a space's services with the space's engine, the others
    (a router) with the engine their program names, if autotune knows it."""

    def __init__(self, space: SearchSpace, *, deployment_file: str) -> None:
        self.space = space
        self.deployment_file = deployment_file
        self.engines = {
            service: get_engine(space.engine_ref(service).name, space.engine_ref(service).version)
            for service in space.services
        }
        self.owners = _owners(space)
        self.findings: dict[tuple[str, str, str, str], Finding] = {}
        self.unchecked: set[str] = set()

    def engine_for(self, service: str, spec: ServiceSpec) -> BaseEngine | None:
        if spec.settings_of in self.engines:
            return self.engines[spec.settings_of]
        return engine_for_command(spec.argv)

    def check(self, rendered: RenderedConfig) -> None:
        for service, spec in rendered.specs.items():
            engine = self.engine_for(service, spec)
            if engine is None or engine.manifest is None:
                self.unchecked.add(service)
                continue
            problems = list(engine.check_command(spec.argv))
            problems += [p for name in sorted(spec.env) if (p := engine.check_env(name))]
            for problem in problems:
                file, fld = self._origin(service, spec.settings_of, problem.option)
                key = (file, fld, service, str(problem))
                finding = self.findings.get(key)
                if finding is None:
                    label = f"{engine.name} {engine.version}"
                    finding = self.findings[key] = Finding(file, fld, service, problem, label)
                finding.configs.append(rendered.label)

    def _origin(self, service: str, role: str, option: str) -> tuple[str, str]:
        """The space parameter that emits ``option`` on ``service`` (whose levers are those
        of ``role``), else the deployment."""
        flag, _ = split_value(option)
        owner = self.owners.get((role, flag))
        if owner is not None:
            return self.space.file, f"parameters.{owner}.target"
        kind = "env" if not flag.startswith("-") else "command"
        return self.deployment_file, f"services.{service}.{kind}"

    def report(self) -> list[Finding]:
        return sorted(
            self.findings.values(), key=lambda f: (f.severity != "error", f.file, f.field)
        )


def _owners(space: SearchSpace) -> dict[tuple[str, str], str]:
    out: dict[tuple[str, str], str] = {}
    for param in space.params:
        target = param.spec.target
        if target is None:
            continue
        for service in param.services:
            for name in owned_flags(target) | owned_env(target):
                out.setdefault((service, name), param.name)
    return out


def check_commands(
    space: SearchSpace,
    deployments: Mapping[str, Deployment],
    *,
    samples: int = DEFAULT_SAMPLES,
    seed: int = 0,
    run_dir: str | Path | None = None,
) -> tuple[list[Finding], int, set[str]]:
    """Render the baseline and ``samples`` configurations on each deployment (file ->
    deployment) and check every command: (findings, commands checked, unchecked services)."""
    configs: list[tuple[str, TrialConfig]] = []
    if space.has_baseline:
        configs.append(("baseline", space.baseline_config()))
    configs += [
        (f"sample {i} (seed {seed})", c)
        for i, c in enumerate(sample_configs(space, n=samples, seed=seed))
    ]
    findings: list[Finding] = []
    checked = 0
    unchecked: set[str] = set()
    for file, deployment in deployments.items():
        checker = CommandChecker(space, deployment_file=file)
        for rendered in render_configs(space, deployment, configs, run_dir=run_dir):
            checker.check(rendered)
            checked += len(rendered.specs)
        findings += checker.report()
        unchecked |= {f"{file}: {s}" for s in checker.unchecked}
    return findings, checked, unchecked


def describe_problems(findings: Sequence[Finding]) -> str:
    return "\n".join(str(f) for f in findings)
