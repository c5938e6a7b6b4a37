"""The sources a deployment is read from besides a command line: a systemd unit file (with its
drop-ins and environment files), a docker compose file, Kubernetes manifests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from init_helpers import Init

from autotune.deployment import load_deployment
from autotune.errors import ConfigError
from autotune.init.systemd import parse_env_file, parse_unit, split_words
from autotune.render import render
from autotune.space import load_space
from autotune.unitfile import environment_line, exec_line

TOKEN = "hf_CANARYtok3nQ7x9Lp2"


def _baseline(init: Init) -> dict[str, object]:
    dep_file, space_file, _ = init.files()
    space = load_space(space_file)
    return render(space, load_deployment(dep_file), space.baseline_config())  # type: ignore[return-value]


# ------------------------------------------------------------------ systemd
def test_exec_start_words_follow_systemd_syntax() -> None:
    argv = [sys.executable, "-m", "x", "--a", "b c", "--d=$HOME", "50%", 'q"x', "t\\y"]
    line = exec_line(argv).split("=", 1)[1]  # autotune's own unit writer (autotune/unitfile.py)
    assert split_words(line, unit="u.service", env={}, what="ExecStart") == argv
    words = split_words(
        "prog $ARGS --x ${Y}z a$$b %n", unit="u.service", env={"ARGS": "a  b", "Y": "y"},
        what="ExecStart",
    )  # fmt: skip
    assert words == ["prog", "a", "b", "--x", "yz", "a$b", "u.service"]
    with pytest.raises(ConfigError, match="specifier %i"):
        split_words("prog --x %i", unit="u@1.service", env={}, what="ExecStart")


def test_drop_ins_reset_lists_and_environment_files_override() -> None:
    text = (
        "# /etc/systemd/system/s.service\n[Service]\nExecStart=/bin/a --x 1\n"
        'Environment="A=1 2" B=3\nEnvironmentFile=-/missing.env\n\n'
        "# /etc/systemd/system/s.service.d/override.conf\n[Service]\nExecStart=\n"
        "ExecStart=/bin/b \\\n  --y 2\nEnvironmentFile=/etc/s.env\n"
    )
    settings = parse_unit(text, "s.service")
    assert settings.files[0] == "/etc/systemd/system/s.service"
    assert settings.exec_start == ["/bin/b    --y 2"]
    assert settings.environment == ['"A=1 2" B=3']
    assert settings.environment_files == ["-/missing.env", "/etc/s.env"]
    assert parse_env_file("# c\nB=\"x y\"\nexport C='z'\n", path="f") == {"B": "x y", "C": "z"}


def test_a_unit_file_imports_with_its_drop_in_and_environment_files(
    init: Init, tmp_path: Path
) -> None:
    env_file = tmp_path / "server.env"
    env_file.write_text(f"HF_TOKEN={TOKEN}\nVLLM_CPU_KVCACHE_SPACE=2\n")
    unit = tmp_path / "vllm.service"
    argv = ["/opt/venv/bin/vllm", "serve", "/models/m", "--port", "8123", "--max-num-seqs", "4"]
    unit.write_text(
        "[Unit]\nDescription=vLLM\n\n[Service]\n"
        + exec_line(["/opt/venv/bin/vllm", "serve", "/models/old"])
        + "\n"
        + environment_line("CUDA_VISIBLE_DEVICES", "0")
        + f"\nEnvironmentFile={env_file}\nEnvironmentFile=-{tmp_path}/optional.env\n"
        "WorkingDirectory=/srv\n"
    )
    (tmp_path / "vllm.service.d").mkdir()
    (tmp_path / "vllm.service.d" / "10-cmd.conf").write_text(
        "[Service]\nExecStart=\n" + exec_line(argv) + "\n"
    )
    result = init("--from-systemd", str(unit))
    assert TOKEN not in "".join(p.read_text() for p in init.files())
    dep, _, _ = init.load()
    server = dep["services"]["server"]
    assert server["command"] == argv[:3] + ["--port", "8123", "--max-num-seqs", "4"]
    assert server["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert server["env"]["HF_TOKEN"] == "${env:HF_TOKEN}"
    assert server["workdir"] == "/srv" and server["port"] == 8123
    assert "manager" not in server  # a unit file outside systemd's directories: run here
    assert "not in a systemd unit directory" in result.output
    assert f"came from EnvironmentFile={env_file}" in result.output


def test_a_required_environment_file_that_is_missing_is_an_error(
    init: Init, tmp_path: Path
) -> None:
    unit = tmp_path / "x.service"
    unit.write_text("[Service]\nExecStart=/usr/bin/vllm serve m\nEnvironmentFile=/nope.env\n")
    result = init("--from-systemd", str(unit), ok=False)
    assert result.exit_code == 2 and "EnvironmentFile=/nope.env does not exist" in result.output


# ------------------------------------------------------------------ compose
def test_compose_services_with_interpolation_gpus_and_health(
    init: Init, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODEL_DIR", "/models")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    (tmp_path / ".env").write_text("SEQS=32\n")
    compose = tmp_path / "compose.yaml"
    compose.write_text(
        yaml.safe_dump(
            {
                "services": {
                    "llm": {
                        "image": "vllm/vllm-openai:v0.32.0",
                        "command": "${MODEL_DIR}/llama --port 8000 --max-num-seqs ${SEQS} "
                        "--api-key ${VLLM_API_KEY}",
                        "environment": {"HF_TOKEN": "${HF_TOKEN}", "VLLM_CPU_KVCACHE_SPACE": 4},
                        "ports": ["8080:8000"],
                        "healthcheck": {"test": ["CMD", "curl", "-f", "http://localhost:8000/health"]},
                        "deploy": {"resources": {"reservations": {"devices": [
                            {"driver": "nvidia", "device_ids": ["2", "3"], "capabilities": ["gpu"]}
                        ]}}},
                    },
                    "cache": {"image": "redis"},
                }
            }
        )
    )  # fmt: skip
    result = init("--from-compose", str(compose), "--service", "llm", "--platform", "gpu")
    dep, _, _ = init.load()
    llm = dep["services"]["llm"]
    assert llm["command"] == [
        "vllm", "serve", "/models/llama", "--port", "8000", "--max-num-seqs", "32",
        "--api-key", "${env:VLLM_API_KEY}",
    ]  # fmt: skip
    assert llm["env"] == {
        "HF_TOKEN": "${env:HF_TOKEN}",
        "VLLM_CPU_KVCACHE_SPACE": "4",
        "CUDA_VISIBLE_DEVICES": "2,3",
    }
    assert llm["port"] == 8000 and llm["health"]["url"].endswith("/health")
    assert dep["gpus"] == 2
    assert TOKEN not in result.output
    missing = init("--from-compose", str(compose), "--service", "nope", ok=False)
    assert "no service named 'nope'" in missing.output


def test_a_compose_variable_set_nowhere_is_an_error(init: Init, tmp_path: Path) -> None:
    compose = tmp_path / "c.yaml"
    compose.write_text(
        yaml.safe_dump({"services": {"s": {"command": "vllm serve ${NOWHERE_SET_X}"}}})
    )
    result = init("--from-compose", str(compose), ok=False)
    assert "${NOWHERE_SET_X} is not set" in result.output


def test_an_unknown_images_entrypoint_is_asked_for(init: Init, tmp_path: Path) -> None:
    compose = tmp_path / "c.yaml"
    compose.write_text(
        yaml.safe_dump({"services": {"s": {"image": "acme/server", "command": ["--port", "1"]}}})
    )
    result = init("--from-compose", str(compose), ok=False)
    assert "give the whole command" in result.output


# ------------------------------------------------------------------ kubernetes
def _deployment(name: str, args: list[str], **container: object) -> dict[str, object]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {"name": "proxy", "image": "envoy", "args": ["--config", "x"]},
                        {"name": "engine", "image": "img", "command": ["python3", "-m"]
                         + args[:1], "args": args[1:], **container},
                    ]
                },
            }
        },
    }  # fmt: skip


def test_kubernetes_workloads_their_secrets_probes_and_gpus(init: Init, tmp_path: Path) -> None:
    manifest = tmp_path / "k8s.yaml"
    server = _deployment(
        "qwen",
        ["vllm.entrypoints.openai.api_server", "--model", "/m", "--port", "$(PORT)",
         "--api-key", "$(API_KEY)"],
        env=[
            {"name": "PORT", "value": "8000"},
            {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            {"name": "CUDA_VISIBLE_DEVICES", "value": "0,1"},
        ],
        readinessProbe={"httpGet": {"path": "/health", "port": 8000}},
        resources={"limits": {"nvidia.com/gpu": 2}},
    )  # fmt: skip
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "qwen"}}
    manifest.write_text(yaml.safe_dump_all([server, service]))
    result = init("--from-k8s", str(manifest))
    dep, space, _ = init.load()
    qwen = dep["services"]["qwen"]
    assert qwen["command"][3:] == ["--model", "/m", "--port", "8000", "--api-key",
                                   "${env:API_KEY}"]  # fmt: skip
    assert qwen["env"]["API_KEY"] == "${env:API_KEY}" and qwen["port"] == 8000
    assert dep["gpus"] == 2 and "nccl_proto" in space["parameters"]  # two GPUs: collectives
    assert "container proxy (a sidecar) not imported" in result.output
    folder = tmp_path / "manifests"  # a directory, as `kubectl apply -f DIR` reads one
    folder.mkdir()
    (folder / "a-server.yaml").write_text(yaml.safe_dump(server))
    (folder / "b-service.yml").write_text(yaml.safe_dump(service))
    (folder / "notes.txt").write_text("not a manifest")
    init("--from-k8s", str(folder), "--force")
    assert init.load()[0]["services"]["qwen"] == qwen
    assert "came from Secret s key k" in result.output
    assert "skipped Service qwen" in result.output


def test_a_leader_worker_set_imports_its_leader(init: Init, tmp_path: Path) -> None:
    leader = {
        "spec": {"containers": [{"name": "leader", "command": ["vllm", "serve", "/m"],
                                 "args": ["--port", "8080", "--tensor-parallel-size", "8"]}]}
    }  # fmt: skip
    lws = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "big"},
        "spec": {"leaderWorkerTemplate": {"leaderTemplate": leader, "size": 2}},
    }
    manifest = tmp_path / "lws.yaml"
    manifest.write_text(yaml.safe_dump(lws))
    result = init("--from-k8s", str(manifest))
    dep, _, _ = init.load()
    assert dep["services"]["big"]["port"] == 8080
    assert "its workers are not" in result.output


def test_a_value_the_cluster_holds_is_asked_for(init: Init, tmp_path: Path) -> None:
    doc = _deployment(
        "x",
        ["vllm.entrypoints.openai.api_server", "--model", "/m"],
        env=[{"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}],
    )
    manifest = tmp_path / "x.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    result = init("--from-k8s", str(manifest), ok=False)
    assert "MODE comes from configMapKeyRef" in result.output


def test_gpu_services_that_do_not_say_which_gpus_are_asked_for(init: Init, tmp_path: Path) -> None:
    docs = [
        _deployment(
            name,
            ["sglang.launch_server", "--model-path", "/m", "--port", str(port),
             "--disaggregation-mode", name],
            resources={"limits": {"nvidia.com/gpu": 4}},
        )
        for name, port in (("prefill", 30000), ("decode", 30001))
    ]  # fmt: skip
    manifest = tmp_path / "pd.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    result = init("--from-k8s", str(manifest), "--endpoint", "decode", ok=False)
    assert "reserve GPUs without naming which" in result.output
    assert "CUDA_VISIBLE_DEVICES" in result.output
