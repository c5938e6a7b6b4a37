"""NVLink multicast stays off: the three pinned variables are in every rendered service
environment, and neither a search space nor a deployment can change them (issue 29)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autotune.deployment import load_deployment, parse_deployment
from autotune.errors import ConfigError
from autotune.pinned_env import PINNED_ENV
from autotune.render import render
from autotune.space import load_space, parse_space

ROOT = Path(__file__).resolve().parents[1]
STUDIES = sorted((ROOT / "studies").glob("*.yaml"))
TP_SPACE = ROOT / "search_spaces" / "vllm-h200-tp.yaml"


def test_the_three_variables_and_values() -> None:
    assert dict(PINNED_ENV) == {
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }


@pytest.mark.parametrize("study", STUDIES, ids=[p.stem for p in STUDIES])
def test_every_service_of_every_bundled_study_has_them(study: Path, tmp_path: Path) -> None:
    # The raw file's space and deployment: loading the whole definition would also check its
    # load (vllm-cpu-capacity's tokenizer is the model the real-engine tests build).
    raw = yaml.safe_load(study.read_text())
    space = load_space(study.parent / raw["space"])
    deployment = load_deployment(study.parent / raw["deployment"])
    rng = random.Random(1)
    configs = [space.baseline_config()] if space.has_baseline else []
    configs += [space.random_config(rng, avoid_forbidden=True) for _ in range(8)]
    for config in configs:
        for name, spec in render(space, deployment, config, run_dir=tmp_path).items():
            for key, value in PINNED_ENV.items():
                assert spec.env.get(key) == value, (study.name, name, config)
                assert key not in spec.unset_env


def test_the_tensor_parallel_space_on_the_h200_launcher(tmp_path: Path) -> None:
    space = load_space(TP_SPACE)
    deployment = load_deployment(ROOT / "launchers" / "vllm-h200-dense.yaml")
    seen_proto = set()
    rng = random.Random(2)
    for config in (space.random_config(rng, avoid_forbidden=True) for _ in range(40)):
        spec = render(space, deployment, config, run_dir=tmp_path)["server"]
        assert "--tensor-parallel-size" in spec.argv
        seen_proto.add(spec.env.get("NCCL_PROTO"))
        assert {k: spec.env[k] for k in PINNED_ENV} == dict(PINNED_ENV)
    assert {"LL", "LL128", "Simple", None} <= seen_proto


def _space(tmp_path: Path, parameters: dict[str, object]) -> dict[str, object]:
    return {
        "name": "pinned",
        "services": ["server"],
        "engine": {"name": "vllm", "version": "0.26.0"},
        "parameters": parameters,
    }


@pytest.mark.parametrize(
    "target",
    [
        {"env": "NCCL_NVLS_ENABLE", "unset_value": "unset"},
        {"map": {"a": {"env": {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "0"}}, "b": {}}},
        {"map": {"a": {"unset_env": ["NVSHMEM_DISABLE_NVLS"]}, "b": {}}},
    ],
    ids=["env", "map-env", "map-unset"],
)
def test_a_space_that_touches_one_is_refused(target: dict[str, object], tmp_path: Path) -> None:
    choices = ["unset", "1"] if "env" in target else ["a", "b"]
    data = _space(tmp_path, {"nvls": {"type": "categorical", "choices": choices, "target": target}})
    with pytest.raises(ConfigError) as err:
        parse_space(data, file="pinned.yaml")
    text = str(err.value)
    assert "pinned.yaml" in text and "parameters.nvls" in text, text
    assert "is fixed to" in text and "no lever may touch it" in text, text


def test_a_deployment_that_sets_another_value_is_refused() -> None:
    data = yaml.safe_load((ROOT / "launchers" / "vllm-h200-dense.yaml").read_text())
    data["services"]["server"]["env"]["NCCL_NVLS_ENABLE"] = "1"
    with pytest.raises(ConfigError) as err:
        parse_deployment(data, file="nvls.yaml")
    text = str(err.value)
    assert "nvls.yaml" in text and "services.server.env.NCCL_NVLS_ENABLE" in text, text
    assert "fixed to '0'" in text and "'0'" in text, text
    data["services"]["server"]["env"]["NCCL_NVLS_ENABLE"] = "0"  # the same value is fine
    parse_deployment(data, file="nvls.yaml")


def test_a_shell_that_turns_multicast_on_does_not_reach_the_service(tmp_path: Path) -> None:
    """The local process manager starts the rendered command in the inherited environment
    merged with the spec's: the pinned values win over the shell's."""
    deployment = parse_deployment(
        {
            "name": "printenv",
            "endpoint": "http://127.0.0.1:1",
            "services": {
                "server": {
                    "command": [
                        sys.executable,
                        "-c",
                        "import os, sys; sys.stdout.write("
                        "','.join(os.environ.get(k, '-') for k in sys.argv[1:]))",
                        *PINNED_ENV,
                    ],
                    "port": 1,
                }
            },
        },
        file="printenv.yaml",
    )
    spec = render(None, deployment, {}, run_dir=tmp_path)["server"]
    shell = {**os.environ, **{k: "1" if v == "0" else "0" for k, v in PINNED_ENV.items()}}
    env = {**shell, **spec.env}  # what autotune/remote/managers/local.py hands the process
    for key in spec.unset_env:
        env.pop(key, None)
    out = subprocess.run(list(spec.argv), env=env, capture_output=True, text=True, check=True)
    assert out.stdout == ",".join(PINNED_ENV.values())
