"""Every rendered SGLang command is accepted by SGLang's real parser (0.5.23).

For every bundled search space that drives SGLang servers and every deployment that runs it
(found from the services the space names and the program each deployment's service runs:
``python -m sglang.launch_server``, ``sglang serve``, or the simulated
``python -m autotune.sim.server``, which takes the same options), the baseline, 200 seeded
random configurations and configurations that reach every categorical and boolean choice and
both ends of every numeric range are rendered with :func:`autotune.render.render`. The
options of every SGLang service (what follows the program) go to
``scripts/engines/dump_parser.py parse sglang`` in the SGLang 0.5.23 environment, all of them
in one call: ``parser.parse_args`` and then ``ServerArgs.from_cli_args``, nothing of ours.
Router services run as ``python -m sglang_router.launch_router`` are checked the same way by
the sglang-router 0.3.2 parser.

The real parser is the oracle, so autotune's own flag checks must not stand between it and
the rendered commands: a space that ``load_space`` refuses is reported as such and rendered
anyway, loaded with ``engine: {name: generic}`` (shape checks only), so the failure also shows
what SGLang itself says about each command.

Controls: a command with the removed ``--cuda-graph-max-bs`` is rejected as ambiguous by the
real parser, an unknown option by the router's; ``autotune space check`` rejects a small
space that targets ``--cuda-graph-max-bs`` (tests/engines/data/control-space.yaml), naming the
file, the parameter, the option and the real ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from space_coverage import covering_configurations, wanted_values
from space_coverage import same as same_choice

from autotune.deployment import Deployment, load_deployment
from autotune.errors import ConfigError
from autotune.render import render
from autotune.space import SearchSpace, load_space
from autotune.space.loader import parse_space
from autotune.yamlio import read_yaml

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
CONTROL_SPACE = DATA / "control-space.yaml"
SEED = 13
SAMPLES = 200
DETAILS_PER_ERROR = 3
"""Rejected commands shown in full (config and options) per distinct error and service."""

MODULES = {
    "sglang.launch_server": "sglang",
    "autotune.sim.server": "sglang",  # the simulated servers take SGLang's options
    "sglang_router.launch_router": "sglang-router",
}
"""``python -m MODULE``: whose real parser reads the options that follow."""
PARSER_NAMES = {"sglang": "sglang 0.5.23", "sglang-router": "sglang-router 0.3.2"}


# --------------------------------------------------------------------------- discovery


def split_program(command: Sequence[str]) -> tuple[str | None, str, list[str]]:
    """(engine whose parser reads the options, the program, the options) of a command
    without its wrapper: ``python [-W ...] -m MODULE OPTIONS`` or ``sglang serve OPTIONS``."""
    tokens = [str(t) for t in command]
    for i in range(1, len(tokens) - 1):
        if tokens[i] == "-m":
            module = tokens[i + 1]
            return MODULES.get(module), " ".join(tokens[: i + 2]), tokens[i + 2 :]
    if len(tokens) >= 2 and Path(tokens[0]).name == "sglang" and tokens[1] == "serve":
        return "sglang", " ".join(tokens[:2]), tokens[2:]
    return None, " ".join(tokens[:1]), tokens[1:]


def _raw(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def service_engines(path: Path) -> dict[str, str | None]:
    """The engine each service of a deployment file runs, from its command (raw YAML, so
    that discovery never depends on the code under test)."""
    services = _raw(path).get("services") or {}
    return {
        name: split_program(svc.get("command") or [])[0]
        for name, svc in services.items()
        if isinstance(svc, dict)
    }


SPACES = sorted((ROOT / "search_spaces").glob("*.yaml"))
DEPLOYMENTS = sorted((ROOT / "launchers").glob("*.yaml"))
ENGINES_OF = {path: service_engines(path) for path in DEPLOYMENTS}
SGLANG_DEPLOYMENTS = [p for p in DEPLOYMENTS if "sglang" in ENGINES_OF[p].values()]
ROUTER_DEPLOYMENTS = [p for p in DEPLOYMENTS if "sglang-router" in ENGINES_OF[p].values()]


def _space_services(path: Path) -> dict[str, str] | None:
    """The services an SGLang space names, each with the engine it runs (``service_engines``
    of the file, else sglang), or None for a space of another engine."""
    raw = _raw(path)
    engine = raw.get("engine")
    if isinstance(engine, dict) and engine.get("name") not in (None, "sglang"):
        return None
    services = raw.get("services")
    if not isinstance(services, list):
        return None
    own = raw.get("service_engines") or {}
    return {
        str(s): str(own[s].get("name")) if isinstance(own.get(s), dict) else "sglang"
        for s in services
    }


def _roles(path: Path) -> dict[str, list[str]]:
    """Search-space service -> the deployment's services that take its levers (``role:``)."""
    out: dict[str, list[str]] = {}
    for name, svc in (_raw(path).get("services") or {}).items():
        role = svc.get("role") if isinstance(svc, dict) else None
        out.setdefault(str(role or name), []).append(name)
    return out


def _pairs() -> list[tuple[Path, Path]]:
    pairs = []
    for space in SPACES:
        services = _space_services(space)
        if not services:
            continue
        for deployment in SGLANG_DEPLOYMENTS:
            engines, roles = ENGINES_OF[deployment], _roles(deployment)
            if all(
                s in roles and all(engines.get(n) == wanted for n in roles[s])
                for s, wanted in services.items()
            ):
                pairs.append((space, deployment))
    return pairs


PAIRS = _pairs()


def _pair_id(pair: tuple[Path, Path]) -> str:
    return f"{pair[0].stem} x {pair[1].stem}"


def _study_pairs() -> list[tuple[str, Path, Path]]:
    """(study, space, deployment) of every bundled study that names both by path."""
    out = []
    for path in sorted((ROOT / "studies").glob("*.yaml")):
        raw = _raw(path)
        space, deployment = raw.get("space"), raw.get("deployment")
        if not isinstance(space, str) or not isinstance(deployment, str):
            continue
        space_path = (path.parent / space).resolve()
        deployment_path = (path.parent / deployment).resolve()
        if space_path.is_file() and deployment_path.is_file():
            out.append((path.stem, space_path, deployment_path))
    return out


# --------------------------------------------------------------------------- configurations


def configurations(space: SearchSpace) -> list[tuple[str, dict[str, Any]]]:
    """The baseline, SAMPLES seeded launchable configurations and one more for every choice
    and range end none of them reached (:mod:`space_coverage`)."""
    return covering_configurations(space, seed=SEED, samples=SAMPLES)


# --------------------------------------------------------------------------- rendering


@dataclass
class Command:
    """One rendered service command and where it came from."""

    what: str  # "dsv4-flash-rtx6000-pd x sim-dsv4-flash-pd", "bare sim-dsv4-flash-pd", ...
    engine: str  # whose parser reads it: sglang, sglang-router
    service: str
    label: str  # config label: baseline, sample 17, moe_runner_backend='cutlass', control ...
    config: Mapping[str, Any]
    program: str
    options: list[str]
    ok: bool | None = None
    error: str = ""


@dataclass
class PairResult:
    commands: list[Command] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """autotune's own refusals (load, render): reported, but never stop the real parser."""


@dataclass
class Checked:
    pairs: dict[tuple[Path, Path], PairResult]
    bare: dict[Path, PairResult]
    controls: dict[str, Command]
    spaces: dict[Path, SearchSpace | None]
    configs: dict[Path, list[tuple[str, dict[str, Any]]]]


def _load(space_path: Path, result: PairResult) -> SearchSpace | None:
    try:
        return load_space(space_path)
    except ConfigError as exc:
        result.problems.append(f"autotune refuses the space: {exc}")
    data = read_yaml(space_path)
    if isinstance(data, dict):
        data = {**data, "engine": {"name": "generic"}}
    try:
        return parse_space(data, file=str(space_path))
    except ConfigError as exc:
        result.problems.append(f"... and with engine: generic too, so nothing was rendered: {exc}")
        return None


def _commands(
    what: str,
    deployment: Deployment,
    specs: Mapping[str, Any],
    label: str,
    config: Mapping[str, Any],
) -> list[Command]:
    out = []
    for name, spec in specs.items():
        command = list(spec.argv[len(deployment.services[name].wrapper) :])
        engine, program, options = split_program(command)
        if engine is not None:
            out.append(Command(what, engine, name, label, config, program, options))
    return out


def _render_all(tmp: Path) -> Checked:
    spaces: dict[Path, tuple[SearchSpace | None, list[str]]] = {}
    configs: dict[Path, list[tuple[str, dict[str, Any]]]] = {}
    wanted = sorted({*SGLANG_DEPLOYMENTS, *ROUTER_DEPLOYMENTS})
    deployments = {p: load_deployment(p) for p in wanted}
    checked = Checked(
        pairs={},
        bare={},
        controls={},
        spaces={},
        configs=configs,
    )

    for path, deployment in deployments.items():
        result = PairResult()
        try:
            specs = render(None, deployment, {}, run_dir=tmp / path.stem)
        except ConfigError as exc:
            result.problems.append(f"autotune cannot render the bare deployment: {exc}")
        else:
            result.commands = _commands(f"bare {path.stem}", deployment, specs, "no space", {})
        checked.bare[path] = result

    for pair in PAIRS:
        space_path, deployment_path = pair
        if space_path not in spaces:
            probe = PairResult()
            space = _load(space_path, probe)
            spaces[space_path] = (space, probe.problems)
            configs[space_path] = configurations(space) if space is not None else []
        space, problems = spaces[space_path]
        result = PairResult(problems=list(problems))
        deployment = deployments[deployment_path]
        for label, config in configs[space_path]:
            try:
                specs = render(space, deployment, config, run_dir=tmp / deployment_path.stem)
            except ConfigError as exc:
                result.problems.append(f"config {label}: autotune cannot render it: {exc}")
                continue
            result.commands += _commands(_pair_id(pair), deployment, specs, label, config)
        checked.pairs[pair] = result
    checked.spaces = {p: s for p, (s, _) in spaces.items()}

    # Controls: the removed alias on real decode options, an unknown option on the router's.
    for path in SGLANG_DEPLOYMENTS:
        for c in checked.bare[path].commands:
            if c.engine == "sglang":
                checked.controls[f"ambiguous {path.stem} {c.service}"] = Command(
                    c.what,
                    c.engine,
                    c.service,
                    "control: + --cuda-graph-max-bs 8",
                    {},
                    c.program,
                    [*c.options, "--cuda-graph-max-bs", "8"],
                )
    for path in ROUTER_DEPLOYMENTS:
        for c in checked.bare[path].commands:
            if c.engine == "sglang-router":
                checked.controls[f"unknown {path.stem} {c.service}"] = Command(
                    c.what,
                    c.engine,
                    c.service,
                    "control: + --cuda-graph-max-bs 8",
                    {},
                    c.program,
                    [*c.options, "--cuda-graph-max-bs", "8"],
                )
    return checked


def _every_command(checked: Checked) -> list[Command]:
    out = [c for r in checked.bare.values() for c in r.commands]
    out += [c for r in checked.pairs.values() for c in r.commands]
    out += list(checked.controls.values())
    return out


@pytest.fixture(scope="module")
def checked(
    tmp_path_factory: pytest.TempPathFactory, engine_envs: Any, request: pytest.FixtureRequest
) -> Checked:
    """Everything rendered, then parsed: one dump_parser.py call per engine."""
    result = _render_all(tmp_path_factory.mktemp("render"))
    by_engine: dict[str, list[Command]] = defaultdict(list)
    for command in _every_command(result):
        by_engine[command.engine].append(command)
    pythons = {"sglang": request.getfixturevalue("sglang_python")}
    if by_engine.get("sglang-router"):
        pythons["sglang-router"] = request.getfixturevalue("router_python")
    for engine, commands in by_engine.items():
        unique: dict[tuple[str, ...], list[Command]] = {}
        for command in commands:
            unique.setdefault(tuple(command.options), []).append(command)
        verdicts = engine_envs.run_dumper(
            pythons[engine], "parse", engine, [list(k) for k in unique]
        )
        assert len(verdicts) == len(unique)
        for same, verdict in zip(unique.values(), verdicts, strict=True):
            for command in same:
                command.ok, command.error = bool(verdict["ok"]), str(verdict["error"])
    return result


# --------------------------------------------------------------------------- reporting


def _config_text(config: Mapping[str, Any]) -> str:
    return json.dumps(dict(config), separators=(", ", ": "), default=str)


def _report(title: str, commands: Sequence[Command], problems: Sequence[str]) -> str:
    rejected = [c for c in commands if not c.ok]
    lines = [title]
    for problem in problems:
        lines.append(f"  {problem}")
    if rejected:
        engines = sorted({PARSER_NAMES.get(c.engine, c.engine) for c in rejected})
        lines.append(
            f"{len(rejected)} of {len(commands)} rendered commands rejected by the real "
            f"parser ({', '.join(engines)}):"
        )
    groups: dict[tuple[str, str], list[Command]] = defaultdict(list)
    for c in rejected:
        groups[(c.service, c.error)].append(c)
    for (service, error), group in groups.items():
        labels = ", ".join(c.label for c in group)
        lines.append(f"- service {service}: {error}")
        lines.append(f"  {len(group)} command(s), configs: {labels}")
        for c in group[:DETAILS_PER_ERROR]:
            lines.append(f"  * [{c.what}] service {c.service}, config {c.label}")
            if c.config:
                lines.append(f"    config:  {_config_text(c.config)}")
            lines.append(f"    command: {c.program} {' '.join(c.options)}")
            lines.append(f"    {PARSER_NAMES.get(c.engine, c.engine)}: {c.error}")
    return "\n".join(lines)


def _assert_all_accepted(title: str, result: PairResult, *, engine: str) -> None:
    mine = [c for c in result.commands if c.engine == engine]
    if result.problems or any(not c.ok for c in mine):
        pytest.fail(_report(title, mine, result.problems), pytrace=False)
    assert mine or result.problems, f"{title}: no {engine} command was rendered"


# --------------------------------------------------------------------------- tests


def test_discovery_covers_sim_and_real_sglang_and_every_study() -> None:
    programs = set()
    for _, deployment in PAIRS:
        for svc in (_raw(deployment).get("services") or {}).values():
            _, program, _ = split_program(svc.get("command") or [])
            programs.add(program.split()[-1])
    assert {"sglang.launch_server", "autotune.sim.server"} <= programs, (PAIRS, programs)
    covered = {(space.resolve(), deployment.resolve()) for space, deployment in PAIRS}
    for study, space, deployment in _study_pairs():
        if _space_services(space):
            assert (space, deployment) in covered, (
                f"study {study} runs {space.name} on {deployment.name}, which the real-parser "
                "check does not cover"
            )


@pytest.mark.parametrize("pair", PAIRS, ids=_pair_id)
def test_rendered_sglang_commands_accepted(pair: tuple[Path, Path], checked: Checked) -> None:
    result = checked.pairs[pair]
    space, deployment = pair
    _assert_all_accepted(
        f"{space.relative_to(ROOT)} on {deployment.relative_to(ROOT)} "
        f"({len(checked.configs[space])} configurations):",
        result,
        engine="sglang",
    )


@pytest.mark.parametrize("deployment", SGLANG_DEPLOYMENTS, ids=lambda p: p.stem)
def test_bare_deployment_sglang_commands_accepted(deployment: Path, checked: Checked) -> None:
    _assert_all_accepted(
        f"{deployment.relative_to(ROOT)} without a search space:",
        checked.bare[deployment],
        engine="sglang",
    )


@pytest.mark.parametrize("deployment", ROUTER_DEPLOYMENTS, ids=lambda p: p.stem)
def test_router_commands_accepted(deployment: Path, checked: Checked) -> None:
    runs = [checked.bare[deployment]] + [
        r for (_, d), r in checked.pairs.items() if d == deployment
    ]
    merged = PairResult(
        commands=[c for r in runs for c in r.commands if c.engine == "sglang-router"],
        problems=list(checked.bare[deployment].problems),
    )
    _assert_all_accepted(
        f"router of {deployment.relative_to(ROOT)} (sglang_router.launch_router):",
        merged,
        engine="sglang-router",
    )


def test_every_choice_is_rendered(checked: Checked) -> None:
    """The configurations reach every categorical/bool choice and both range ends that a
    launchable configuration can have (one that none can have is never launched)."""
    for space_path, space in checked.spaces.items():
        if space is None:
            continue
        configs = checked.configs[space_path]
        missing = []
        for param in space.sampled_params:
            for value in wanted_values(param):
                if not any(same_choice(config.get(param.name), value) for _, config in configs):
                    missing.append(f"{param.name}={value!r}")
        assert not missing, f"{space_path.name}: never rendered: {', '.join(missing)}"


def test_control_removed_alias_is_ambiguous(checked: Checked) -> None:
    controls = {k: c for k, c in checked.controls.items() if k.startswith("ambiguous ")}
    assert controls, "no SGLang command to build the control from"
    for name, c in controls.items():
        assert c.ok is False, f"{name}: the real parser accepted --cuda-graph-max-bs"
        assert "ambiguous option" in c.error, (name, c.error)
        assert "--cuda-graph-max-bs-decode" in c.error, (name, c.error)


def test_control_router_rejects_unknown_option(checked: Checked) -> None:
    controls = {k: c for k, c in checked.controls.items() if k.startswith("unknown ")}
    if not ROUTER_DEPLOYMENTS:
        pytest.skip("no deployment runs sglang_router.launch_router")
    assert controls
    for name, c in controls.items():
        assert c.ok is False, f"{name}: the router parser accepted --cuda-graph-max-bs"
        assert "unrecognized arguments: --cuda-graph-max-bs" in c.error, (name, c.error)


def test_control_space_check_rejects_removed_alias() -> None:
    autotune = Path(sys.executable).with_name("autotune")
    assert autotune.exists(), autotune
    relative = CONTROL_SPACE.relative_to(ROOT)
    proc = subprocess.run(
        [str(autotune), "space", "check", str(relative)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"},
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, f"space check accepted {relative}:\n{output}"
    for needle in (
        "control-space.yaml",
        "cuda_graph_max_bs",
        "--cuda-graph-max-bs",
        "--cuda-graph-max-bs-decode",
    ):
        assert needle in output, f"{needle!r} not in the output of space check:\n{output}"
