"""``best --export compose``: one compose service per service, checked offline against the
compose specification's JSON schema (tests/data/compose-spec/, official, vendored) for every
bundled deployment, and by ``docker compose config`` where docker has the compose plugin.

Negative controls break a valid file in one place each and show the schema refuses it. The
argv, environment, GPU reservation, health check and order are checked against the stored
trial with oracles written from the documented format (container_cases.py).
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest_results import TrialSpec, make_study, record
from container_cases import (
    assert_container_argv,
    bundled_trial,
    cases,
    compose_errors,
    compose_unescape,
)

from autotune.export import export_compose
from autotune.results import TrialResult, load_results

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


def _has_compose() -> bool:
    if shutil.which("docker") is None:
        return False
    proc = subprocess.run(
        ["docker", "compose", "version"], capture_output=True, text=True, timeout=30, check=False
    )
    return proc.returncode == 0


needs_compose = pytest.mark.skipif(
    not _has_compose(), reason="docker with the compose plugin (`docker compose`) not here"
)


def one_trial(tmp_path: Path, services: dict[str, dict[str, Any]]) -> TrialResult:
    return load_results(make_study(tmp_path / "db", [TrialSpec(services=services)]))[0]


@pytest.mark.parametrize(("deployment", "seed"), cases())
def test_every_bundled_deployment_exports_a_valid_compose_file(
    tmp_path: Path, deployment: str, seed: int | None
) -> None:
    trial = bundled_trial(tmp_path, deployment, seed=seed)
    doc = yaml.safe_load(export_compose(trial, study="My Study"))
    assert compose_errors(doc) == []
    assert doc["name"] == "autotune-my-study"
    services = doc["services"]
    assert set(services) == set(trial.services)
    if "router" in services:
        assert list(services)[-1] == "router"  # start order: workers first
    hostnames = {n: n for n in trial.services}
    for name, rec in trial.services.items():
        svc = services[name]
        argv = [compose_unescape(w) for w in svc["entrypoint"] + svc.get("command", [])]
        assert_container_argv(rec.argv, argv, hostnames)
        gpus = [g for g in rec.env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
        want = {k: v for k, v in rec.env.items() if not (gpus and k == "CUDA_VISIBLE_DEVICES")}
        env = {k: compose_unescape(v) for k, v in svc.get("environment", {}).items()}
        assert env == want
        if gpus:
            (device,) = svc["deploy"]["resources"]["reservations"]["devices"]
            assert device == {"driver": "nvidia", "device_ids": gpus, "capabilities": ["gpu"]}
            assert svc["ipc"] == "host"
        else:
            assert "deploy" not in svc
        health = rec.health_url or ""
        port_path = health.split("/", 2)[2].split(":", 1)[1]  # PORT/path
        assert svc["healthcheck"]["test"][-1] == f"http://127.0.0.1:{port_path}"
        assert svc["healthcheck"]["test"][:2] == ["CMD", "python3"]
        assert svc["healthcheck"]["start_period"] == f"{int(rec.ready_timeout_s or 600)}s"
        deps = rec.depends_on or []
        assert svc.get("depends_on", {}) == {d: {"condition": "service_healthy"} for d in deps}
        published = bool(svc.get("ports"))
        assert published == (not any(name in (r.depends_on or []) for r in trial.services.values()))
        assert svc["labels"] == {
            "autotune.io/service": name,
            "autotune.io/study": "My Study",
            "autotune.io/trial": str(trial.number),
        }


def test_the_simulated_deployment_in_detail(tmp_path: Path) -> None:
    trial = bundled_trial(tmp_path, "sim-dsv4-flash-pd")
    said: list[str] = []
    text = export_compose(trial, study="dsv4-flash-sim", notes=said.append)
    services = yaml.safe_load(text)["services"]
    router = services["router"]
    port = trial.services["prefill"].argv[trial.services["prefill"].argv.index("--port") + 1]
    assert f"http://prefill:{port}" in router["command"]
    assert router["image"] == "lmsysorg/sglang:v0.5.23"
    router_port = int(router["command"][router["command"].index("--port") + 1])
    assert router["ports"] == [
        {
            "target": router_port,
            "published": str(router_port),
            "host_ip": "127.0.0.1",
            "protocol": "tcp",
        }
    ]
    assert router["healthcheck"]["test"][-1].endswith("/readiness")
    assert services["prefill"]["image"].startswith("${AUTOTUNE_IMAGE_PREFILL:?")
    assert any("--image prefill=IMAGE" in n for n in said)
    assert list(services) == ["prefill", "decode", "router"]


MUTATIONS = {
    "unknown service key": lambda d: d["services"]["server"].update({"gpus_count": 1}),
    "unknown top-level key": lambda d: d.update({"servces": {}}),
    "a depends_on condition that does not exist": lambda d: d["services"]["server"].update(
        {"depends_on": {"x": {"condition": "service_ready"}}}
    ),
    "a device without capabilities": lambda d: d["services"]["server"]["deploy"]["resources"][
        "reservations"
    ]["devices"][0].pop("capabilities"),
    "retries as a list": lambda d: d["services"]["server"]["healthcheck"].update({"retries": [3]}),
    "command as a mapping": lambda d: d["services"]["server"].update({"command": {"a": 1}}),
    "environment value as a list": lambda d: d["services"]["server"]["environment"].update(
        {"X": ["a"]}
    ),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_schema_refuses_a_broken_compose_file(tmp_path: Path, mutation: str) -> None:
    doc = yaml.safe_load(export_compose(bundled_trial(tmp_path, "vllm-h200-dense")))
    assert compose_errors(doc) == []
    broken = copy.deepcopy(doc)
    MUTATIONS[mutation](broken)
    assert compose_errors(broken) != []


def test_secrets_are_required_interpolations_never_values(tmp_path: Path) -> None:
    rec = record(
        ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "8000",
         "--api-key=sk-live-abcdef123456", "--host", "127.0.0.1"],
        {"HF_TOKEN": "hf_supersecretvalue1"},
        [],
    )  # fmt: skip
    said: list[str] = []
    text = export_compose(one_trial(tmp_path, {"server": rec}), notes=said.append)
    assert "sk-live-abcdef123456" not in text and "hf_supersecretvalue1" not in text
    svc = yaml.safe_load(text)["services"]["server"]
    assert svc["environment"]["HF_TOKEN"].startswith("${HF_TOKEN:?")
    assert "AUTOTUNE_SECRET_API_KEY" not in svc["environment"]  # only in the command
    (word,) = [w for w in svc["command"] if w.startswith("--api-key=")]
    assert word.startswith("--api-key=${AUTOTUNE_SECRET_API_KEY:?") and word.endswith("}")
    (note,) = [n for n in said if ".env" in n]
    assert "AUTOTUNE_SECRET_API_KEY, HF_TOKEN" in note and "never writes credentials" in note
    assert compose_errors(yaml.safe_load(text)) == []


def test_literal_dollars_survive_compose_interpolation(tmp_path: Path) -> None:
    words = ["$HOME", "${PATH}", "$$", "a$b", "$"]
    rec = record(
        ["/usr/bin/python3", "-m", "mysrv", "--port", "8000", "--tag", *words],
        {"WEIRD": "${X:-y} and $Z"},
        [],
    )
    svc = yaml.safe_load(export_compose(one_trial(tmp_path, {"w": rec})))["services"]["w"]
    assert [compose_unescape(w) for w in svc["command"][-len(words) :]] == words
    assert compose_unescape(svc["environment"]["WEIRD"]) == "${X:-y} and $Z"


def test_a_program_that_is_not_python_is_checked_with_curl(tmp_path: Path) -> None:
    rec = record(["/opt/bin/my-server", "--port", "9000", "--host", "127.0.0.1"], {}, [])
    svc = yaml.safe_load(export_compose(one_trial(tmp_path, {"s": rec})))["services"]["s"]
    assert svc["entrypoint"] == ["/opt/bin/my-server"]
    assert svc["command"] == ["--port", "9000", "--host", "0.0.0.0"]
    assert svc["healthcheck"]["test"][:2] == ["CMD", "curl"]


@needs_compose
@pytest.mark.parametrize("deployment", ["sim-dsv4-flash-pd", "vllm-h200-dense"])
def test_docker_compose_config_reads_the_file(tmp_path: Path, deployment: str) -> None:
    trial = bundled_trial(tmp_path, deployment)
    path = tmp_path / "compose.yaml"
    path.write_text(export_compose(trial, study="check", images=["example.com/img:1"]))
    proc = subprocess.run(
        ["docker", "compose", "-f", str(path), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "HF_TOKEN": "x"},
    )
    assert proc.returncode == 0, proc.stderr
