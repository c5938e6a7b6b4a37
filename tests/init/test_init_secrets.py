"""Credentials are never written: they become ``${env:VAR}`` references the deployment reads
from the environment ``autotune run`` starts in, and ``autotune init`` says so."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from init_helpers import Init

from autotune.deployment import load_deployment, parse_deployment
from autotune.errors import ConfigError
from autotune.render import render
from autotune.space import load_space

TOKEN = "hf_CANARYtok3nQ7x9Lp2"
KEY = "sk-CANARYk3yZ81234567"
PASSWORD = "CANARYpassw0rd99"


def _leaks(root: Path) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file():
            text = path.read_text()
            found += [f"{path.name}: {s}" for s in (TOKEN, KEY, PASSWORD) if s in text]
    return found


def test_credentials_become_references_and_come_back_at_run_time(
    init: Init, monkeypatch: pytest.MonkeyPatch
) -> None:
    command = (
        f"HF_TOKEN={TOKEN} DB_PASSWORD={PASSWORD} VLLM_CPU_KVCACHE_SPACE=1 "
        f"vllm serve /m --port 8005 --api-key {KEY} --max-num-seqs 8"
    )
    result = init("--from-command", command)
    assert _leaks(init.out) == []
    assert TOKEN not in result.output and KEY not in result.output
    dep, _, _ = init.load()
    server = dep["services"]["server"]
    assert server["env"]["HF_TOKEN"] == "${env:HF_TOKEN}"
    assert server["env"]["DB_PASSWORD"] == "${env:DB_PASSWORD}"
    assert "${env:AUTOTUNE_SECRET_API_KEY}" in server["command"]
    for var in ("HF_TOKEN", "DB_PASSWORD", "AUTOTUNE_SECRET_API_KEY"):
        assert f"written as ${{env:{var}}}" in result.output and f"export {var}" in result.output
    # With the values in autotune's environment the baseline is the command that runs today.
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("DB_PASSWORD", PASSWORD)
    monkeypatch.setenv("AUTOTUNE_SECRET_API_KEY", KEY)
    dep_file, space_file, _ = init.files()
    space = load_space(space_file)
    spec = render(space, load_deployment(dep_file), space.baseline_config())["server"]
    assert list(spec.argv) == command.split()[3:]
    assert spec.env["HF_TOKEN"] == TOKEN and spec.env["DB_PASSWORD"] == PASSWORD
    # Without them rendering says which variable to export, and renders nothing.
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(ConfigError, match="HF_TOKEN is not set there: export HF_TOKEN first"):
        render(space, load_deployment(dep_file), space.baseline_config())


def test_a_credential_flag_written_with_equals_stays_a_reference(init: Init) -> None:
    init(
        "--from-command",
        f"python -m sglang.launch_server --model-path /m --api-key={KEY} --port 30000",
    )
    dep, _, _ = init.load()
    assert "--api-key=${env:AUTOTUNE_SECRET_API_KEY}" in dep["services"]["server"]["command"]
    assert _leaks(init.out) == []


def test_the_env_template_is_a_deployment_feature() -> None:
    """``${env:VAR}`` in any string of a deployment (shared package: autotune/deployment/)."""
    dep = parse_deployment(
        {
            "name": "t",
            "endpoint": "http://${s.host}:${s.port}",
            "services": {
                "s": {
                    "command": ["prog", "--key", "${env:T_KEY}", "--literal", "$${env:T_KEY}"],
                    "env": {"T_TOKEN": "${env:T_TOKEN}"},
                    "port": 8000,
                }
            },
        },
        file="t.yaml",
    )  # loading needs no credential
    os.environ.pop("T_KEY", None)
    with pytest.raises(ConfigError, match="T_KEY is not set") as caught:
        render(None, dep, {})
    assert caught.value.field == "services.s.command[2]"
    environ = {"T_KEY": "k-123", "T_TOKEN": "t-456"}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in environ.items():
            mp.setenv(k, v)
        spec = render(None, dep, {})["s"]
    assert list(spec.argv) == ["prog", "--key", "k-123", "--literal", "${env:T_KEY}"]
    assert spec.env["T_TOKEN"] == "t-456"
    with pytest.raises(ConfigError, match="not an environment variable name"):
        parse_deployment(
            {
                "name": "t",
                "endpoint": "http://${s.host}:${s.port}",
                "services": {"s": {"command": ["p", "${env:1X}"], "port": 8000}},
            },
            file="t.yaml",
        )
