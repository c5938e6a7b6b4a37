"""env / command / json exports, checked by running them in a real shell where they are shell."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest_results import TrialSpec, make_study, record

from autotune.errors import ConfigError
from autotune.export import FORMATS, export, export_command, export_env, export_json
from autotune.results import TrialResult, best_trial, load_results

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

BASH = shutil.which("bash")
needs_bash = pytest.mark.skipif(BASH is None, reason="bash not installed")
PY = os.path.abspath(sys.executable)
NASTY = "a b \"q\" 's' 50% $HOME `id` \\x ;"
PRINTER = (
    "import json, os, sys; "
    "print(json.dumps([sys.argv[1:], os.environ.get('NASTY'), 'NCCL_PROTO' in os.environ]))"
)


def nasty_trial(tmp_path: Path, *, stored_command: bool) -> TrialResult:
    rec = record([PY, "-c", PRINTER, "x y", "$HOME", ";"], {"NASTY": NASTY}, ["NCCL_PROTO"])
    if not stored_command:
        rec["command"] = ""  # forces the rebuild from argv/env/unset_env
    study = make_study(tmp_path, [TrialSpec(services={"worker": rec})])
    return load_results(study)[0]


@pytest.fixture
def pd_trial(tmp_path: Path) -> TrialResult:
    study = make_study(tmp_path, [TrialSpec(throughput=900.0)], multi=True)
    best = best_trial(study)
    assert best is not None
    return best


@needs_bash
def test_env_export_is_valid_shell(tmp_path: Path) -> None:
    text = export_env(nasty_trial(tmp_path, stored_command=True))
    assert "unset NCCL_PROTO" in text
    assert BASH is not None
    script = text + '\nprintf "%s" "$NASTY"; [ -z "${NCCL_PROTO+x}" ] && printf "|unset"'
    proc = subprocess.run(
        [BASH, "-euc", script],
        env={**os.environ, "NCCL_PROTO": "LL"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == NASTY + "|unset"


@needs_bash
@pytest.mark.parametrize("stored_command", [True, False])
def test_command_lines_paste_and_run(tmp_path: Path, stored_command: bool) -> None:
    text = export_command(nasty_trial(tmp_path, stored_command=stored_command))
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(lines) == 1
    assert BASH is not None
    proc = subprocess.run(
        [BASH, "-c", lines[0]],
        env={**os.environ, "NCCL_PROTO": "LL"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [["x y", "$HOME", ";"], NASTY, False]


def test_command_export_orders_services(pd_trial: TrialResult) -> None:
    text = export_command(pd_trial)
    headers = [line for line in text.splitlines() if line.startswith("# --- ")]
    assert headers == ["# --- prefill", "# --- decode", "# --- router"]
    decode_line = text.splitlines()[text.splitlines().index("# --- decode") + 1]
    assert shlex.split(decode_line)[:3] == ["env", "-u", "NCCL_PROTO"]


def test_json_export(pd_trial: TrialResult) -> None:
    doc = json.loads(export_json(pd_trial))
    assert doc["trial"] == 0 and doc["feasible"] is True
    assert doc["values"] == {"output_throughput_tok_s": 900.0, "tpot_p99_ms": 50.0}
    assert doc["config"]["moe_runner_backend"] == "marlin"
    assert doc["metrics"]["output_throughput"] == 900.0
    assert set(doc["services"]) == {"prefill", "decode", "router"}
    assert doc["services"]["decode"]["env"]["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert doc["services"]["router"]["command"].startswith(PY)
    assert doc["start_order"][-1] == "router"


@pytest.mark.parametrize("fmt", ["env", "command", "json"])
def test_export_dispatch_text_and_file(tmp_path: Path, pd_trial: TrialResult, fmt: str) -> None:
    text = export(pd_trial, fmt=fmt, out_dir=None)  # type: ignore[arg-type]
    assert isinstance(text, str) and text
    written = export(pd_trial, fmt=fmt, out_dir=tmp_path / "o")  # type: ignore[arg-type]
    assert isinstance(written, list) and len(written) == 1
    assert written[0].read_text() == text
    assert written[0].name.startswith("trial-0.")


def test_unknown_format(pd_trial: TrialResult) -> None:
    assert FORMATS == ("systemd", "env", "command", "json", "compose", "k8s")
    with pytest.raises(ConfigError, match="allowed: systemd, env, command, json, compose, k8s"):
        export(pd_trial, fmt="yaml", out_dir=None)  # type: ignore[arg-type]
