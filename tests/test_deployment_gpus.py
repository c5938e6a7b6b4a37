"""The deployment's optional ``gpus:`` (GPUs it occupies in total): bundled values, and a
bad value is one ConfigError naming the file and the field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from autotune.deployment import available_deployments, load_deployment
from autotune.errors import ConfigError

GOOD = """
name: tiny
endpoint: http://${worker.host}:${worker.port}
services:
  worker:
    command: ["${python}", -m, http.server, --bind, "${host}", "${port}"]
    port: auto
"""


def test_bundled_deployments_say_how_many_gpus_they_occupy() -> None:
    gpus = {name: load_deployment(path).gpus for name, path in available_deployments().items()}
    assert gpus == {
        "dsv4-flash-pd-local": 8,  # prefill TP4 + decode TP4 on one 8-GPU host
        "dsv4-flash-pd-ssh": 8,  # prefill TP4 on gpu-a, decode TP4 on gpu-b
        "sim-dsv4-flash-pd": 8,  # the modeled hardware
        "sim-dsv4-flash-pd-ssh": 8,
        "sim-dsv4-flash-pd-2node": 16,  # two such nodes
        "transformers-serve-local": 1,
        "transformers-serve-cpu": None,  # CPUs only
        "vllm-cpu-local": None,  # CPUs only: unknown, figures per deployment
        "vllm-h200-dense": 1,  # one H200
        "vllm-h200-moe": 1,
    }


def test_gpus_is_optional(tmp_path: Path) -> None:
    path = tmp_path / "dep.yaml"
    path.write_text(textwrap.dedent(GOOD))
    assert load_deployment(path).gpus is None
    path.write_text(textwrap.dedent(GOOD) + "gpus: 4\n")
    assert load_deployment(path).gpus == 4


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("0", "greater than or equal to 1"),
        ("-8", "greater than or equal to 1"),
        ('"8"', "expected an integer, got str '8'"),  # quoted: no silent conversion
        ("8.0", "expected an integer, got float 8.0"),
        ("true", "expected an integer, got bool True"),
        ("[8]", "expected an integer, got list [8]"),
    ],
)
def test_bad_gpus_is_one_config_error(tmp_path: Path, value: str, words: str) -> None:
    path = tmp_path / "dep.yaml"
    path.write_text(textwrap.dedent(GOOD) + f"gpus: {value}\n")
    with pytest.raises(ConfigError) as info:
        load_deployment(path)
    assert info.value.file == str(path)
    assert info.value.field == "gpus"
    assert words in str(info.value)
