"""``autotune space render`` and ``autotune space check``: dry runs through the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
TS_SPACE = REPO / "search_spaces" / "transformers-serve.yaml"
TS_DEPLOYMENT = REPO / "launchers" / "transformers-serve-local.yaml"


def cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autotune.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_render_baseline_sample_and_config() -> None:
    base = cli("space", "render", str(TS_SPACE), "--deployment", str(TS_DEPLOYMENT))
    assert base.returncode == 0, base.stderr
    assert base.stdout.startswith("# baseline:")
    assert "[serve]" in base.stdout and "transformers.cli.transformers serve" in base.stdout

    args = ("space", "render", str(TS_SPACE), "--deployment", str(TS_DEPLOYMENT), "--json")
    first = cli(*args, "--sample", "3", "--seed", "5")
    again = cli(*args, "--sample", "3", "--seed", "5")
    other = cli(*args, "--sample", "3", "--seed", "6")
    assert first.returncode == 0, first.stderr
    rendered = json.loads(first.stdout)
    assert [r["label"] for r in rendered] == [f"sample {i} (seed 5)" for i in range(3)]
    configs = [r["config"] for r in rendered]
    assert configs == [r["config"] for r in json.loads(again.stdout)]  # reproducible
    assert configs != [r["config"] for r in json.loads(other.stdout)]
    serve = rendered[0]["services"]["serve"]
    assert serve["argv"][-1].startswith("--") or serve["argv"][-2].startswith("--")
    assert serve["command_line"].endswith(" ".join(serve["argv"][-2:]))

    one = cli(*args, "--config", json.dumps({"continuous_batching": False}))
    assert one.returncode == 0, one.stderr
    [item] = json.loads(one.stdout)
    assert item["label"] == "config" and item["config"]["continuous_batching"] is False
    assert "--continuous-batching" not in item["services"]["serve"]["argv"]


def test_render_refuses_bad_input() -> None:
    args = ("space", "render", str(TS_SPACE), "--deployment", str(TS_DEPLOYMENT))
    bad = cli(*args, "--config", "{not json")
    assert bad.returncode == 2 and "--config" in bad.stderr + bad.stdout
    both = cli(*args, "--config", "{}", "--sample", "2")
    assert both.returncode == 2 and "at most one of" in both.stderr + both.stdout
    unknown = cli(*args, "--config", json.dumps({"no_such_param": 1}))
    assert unknown.returncode == 2 and "no_such_param" in unknown.stderr + unknown.stdout


def test_check_passes_a_bundled_space_on_its_deployment() -> None:
    out = cli("space", "check", str(TS_SPACE), "--deployment", str(TS_DEPLOYMENT))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ok: 201 commands" in out.stdout
    assert "transformers-serve 5.17.0: 0 error(s)" in out.stdout


def _sglang_space(tmp_path: Path) -> Path:
    space = {
        "name": "control",
        "engine": {"name": "sglang", "version": "0.5.23"},
        "services": ["server"],
        "parameters": {
            "mem": {
                "type": "float",
                "low": 0.7,
                "high": 0.9,
                "step": 0.1,
                "target": {"flag": "--mem-fraction-static"},
            },
            "graphs": {
                "type": "categorical",
                "choices": ["full", "disabled"],
                "target": {"flag": "--cuda-graph-backend-decode"},
            },
        },
        "baseline": {"mem": 0.8, "graphs": "full"},
    }
    path = tmp_path / "control-space.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def _deployment(tmp_path: Path, extra: list[str]) -> Path:
    deployment = {
        "name": "control",
        "endpoint": "http://${server.host}:${server.port}",
        "services": {
            "server": {
                "command": [
                    "numactl",
                    "--membind=0",
                    "python3",
                    "-m",
                    "sglang.launch_server",
                    "--model-path",
                    "/m",
                    "--host",
                    "${host}",
                    "--port",
                    "${port}",
                    *extra,
                ],  # fmt: skip
                "host": "127.0.0.1",
                "port": 30000,
            }
        },
    }
    path = tmp_path / "control-deployment.yaml"
    path.write_text(yaml.safe_dump(deployment, sort_keys=False))
    return path


def test_check_names_file_field_option_and_closest(tmp_path: Path) -> None:
    space = _sglang_space(tmp_path)
    good = cli("space", "check", str(space), "--deployment", str(_deployment(tmp_path, [])))
    assert good.returncode == 0, good.stdout + good.stderr
    assert "sglang 0.5.23: 0 error(s)" in good.stdout

    # a deployment still written for SGLang < 0.5.20: --cuda-graph-max-bs is now ambiguous
    old = _deployment(tmp_path, ["--cuda-graph-max-bs", "8", "--tp", "4"])
    bad = cli("space", "check", str(space), "--deployment", str(old), "--sample", "10")
    assert bad.returncode == 1
    text = bad.stdout + bad.stderr
    assert "control-deployment.yaml: field 'services.server.command'" in text
    assert "ambiguous option --cuda-graph-max-bs in sglang 0.5.23" in text
    assert "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill" in text
    assert "--tp is an abbreviation of --tp-size" in text
    assert "in 11 rendered configs" in text
    assert "FAILED: 11 commands" in text


def test_check_rejects_a_space_parameter_with_a_removed_option(tmp_path: Path) -> None:
    space = _sglang_space(tmp_path)
    data = yaml.safe_load(space.read_text())
    data["parameters"]["graphs"] = {
        "type": "int",
        "low": 8,
        "high": 64,
        "step": 8,
        "target": {"flag": "--cuda-graph-max-bs"},
    }
    data["baseline"] = {"mem": 0.8, "graphs": 8}
    space.write_text(yaml.safe_dump(data))
    out = cli("space", "check", str(space))
    assert out.returncode == 2
    text = out.stdout + out.stderr
    assert "control-space.yaml: field 'parameters.graphs.target.flag'" in text
    assert "ambiguous option --cuda-graph-max-bs" in text
    assert "closest: --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill" in text


def test_check_flags_a_value_outside_the_real_choices(tmp_path: Path) -> None:
    space = _sglang_space(tmp_path)
    data = yaml.safe_load(space.read_text())
    data["parameters"]["graphs"]["choices"] = ["full", "off"]
    space.write_text(yaml.safe_dump(data))
    out = cli("space", "check", str(space))
    assert out.returncode == 2
    text = out.stdout + out.stderr
    assert "field 'parameters.graphs.target.flag'" in text
    assert "invalid choice 'off'" in text and "breakable" in text
