"""GPU telemetry end to end: ``autotune run`` on the bundled simulated deployment (real
servers behind the real router), ``best`` and ``report`` after it.

With a fake ``pynvml`` on the tuner's path (tests/fake_pynvml.py, 8 GPUs: the sim's prefill
names 0-3 and its decode 4-7), an ``energy`` study scores every measured trial in output
tokens per kJ and stores the GPUs' figures; without NVML (this CPU machine as it is) every
trial stores ``none`` with the reason, which the run says once and ``best`` prints.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
from e2e_helpers import E2E_STUDY, FAST_CONFIG, REPO, autotune_cli, load
from fake_pynvml import module_dir

from autotune import results
from autotune.results import load_remeasurements

pytestmark = pytest.mark.slow


def _study_file(tmp_path: Path, name: str, extra: str) -> Path:
    text = (
        E2E_STUDY.read_text()
        .replace("../../search_spaces", str(REPO / "search_spaces"))
        .replace("../../launchers", str(REPO / "launchers"))
        .replace("name: e2e", f"name: {name}")
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(text + extra)
    return path


def _enqueue_fast() -> str:
    return "enqueue:\n  - {" + ", ".join(f"{k}: {v}" for k, v in FAST_CONFIG.items()) + "}\n"


def test_an_energy_study_with_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("sglang_router")
    monkeypatch.setenv("PYTHONPATH", str(module_dir(tmp_path)))
    monkeypatch.setenv("FAKE_NVML_GPUS", "8")
    monkeypatch.setenv("FAKE_NVML_POWER_W", "350")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    extra = "remeasure: {budget: 1}\n" + _enqueue_fast()
    study_file = _study_file(tmp_path, "energy", extra)
    study_file.write_text(
        study_file.read_text().replace("objective: throughput", "objective: energy")
    )
    db, url = tmp_path / "e.db", f"sqlite:///{tmp_path / 'e.db'}"
    run = autotune_cli(
        "run", "--trials", "2", "--study", "energy", "--storage", url,
        "--study-file", str(study_file), cwd=tmp_path, timeout=400,
    )  # fmt: skip
    assert "GPU telemetry: none" not in run.stdout + run.stderr
    study = load("energy", db)
    assert study.metric_names == ["output_tok_per_kj"]
    measured = [t for t in study.trials if t.user_attrs.get("failure") is None]
    assert len(measured) == 2, [t.user_attrs.get("reason") for t in study.trials]
    for trial in measured:
        t = trial.user_attrs["telemetry"]
        assert t["source"] == "nvml" and len(t["gpus"]) == 8
        assert t["energy_source"] == "counter" and t["power_mean_w"] == pytest.approx(8 * 350)
        assert t["output_tokens"] == trial.user_attrs["metrics"]["output_tokens"] > 0
        assert t["energy_per_token_j"] == pytest.approx(t["energy_j"] / t["output_tokens"])
        assert trial.values[0] == pytest.approx(1000.0 / t["energy_per_token_j"])
        assert math.isfinite(trial.values[0]) and trial.values[0] > 0
    again = load_remeasurements(study)
    assert again  # the race's one restart: measured again, its GPUs with it
    stored = study.user_attrs[f"remeasure:{again[0].of}:{again[0].repeat}"]
    assert stored["telemetry"]["source"] == "nvml"
    # which machine each measurement ran on: its 8 GPUs' UUIDs, the same for all here
    machine = results.config_estimates(study)[0].measurements[0].machine
    assert machine is not None and len(machine.split(",")) == 8
    assert {m.machine for m in again} == {machine}
    best = autotune_cli("best", "--study", "energy", "--storage", url, cwd=tmp_path)
    text = " ".join(best.stdout.split())
    assert "measured on" not in text  # one machine: nothing to say
    assert "│ energy efficiency │" in text and "tok/kJ" in text
    assert "│ GPU telemetry │ 8 GPU(s) (NVIDIA H200)" in text
    assert "│ GPU power │ mean 2,800.0 W" in text and " J/token (" in text
    autotune_cli("report", "--study", "energy", "--storage", url, "--out", "r.html", cwd=tmp_path)
    html = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "<th>J/token</th>" in html and "best trial: energy per token" in html


def test_without_nvml_every_trial_says_none_and_why(tmp_path: Path) -> None:
    pytest.importorskip("sglang_router")
    if importlib.util.find_spec("pynvml") is not None:
        pytest.skip("pynvml is installed here: this is the path of a machine without it")
    reason = "NVML not available: No module named 'pynvml'"
    extra = "remeasure: {budget: 0}\n" + _enqueue_fast()
    study_file = _study_file(tmp_path, "cpu", extra)
    db, url = tmp_path / "c.db", f"sqlite:///{tmp_path / 'c.db'}"
    run = autotune_cli(
        "run", "--trials", "2", "--study", "cpu", "--storage", url,
        "--study-file", str(study_file), cwd=tmp_path, timeout=400,
    )  # fmt: skip
    said = (run.stdout + run.stderr).count(f"GPU telemetry: none ({reason})")
    assert said == 1, run.stdout + run.stderr
    measured = [t for t in load("cpu", db).trials if t.user_attrs.get("failure") is None]
    assert len(measured) == 2  # the baseline and the enqueued configuration, each said none
    for trial in measured:
        tokens = trial.user_attrs["metrics"]["output_tokens"]
        assert trial.user_attrs["telemetry"] == {
            "source": "none",
            "reason": reason,
            "output_tokens": tokens,
            **NONE,
        }
    best = autotune_cli("best", "--study", "cpu", "--storage", url, cwd=tmp_path)
    assert f"│ GPU telemetry │ none ({reason})" in " ".join(best.stdout.split())


NONE: dict[str, object] = {
    "interval_s": None,
    "duration_s": None,
    "samples": 0,
    "gpus": [],
    "util_mean_pct": None,
    "util_max_pct": None,
    "memory_used_max_mib": None,
    "power_mean_w": None,
    "power_max_w": None,
    "energy_j": None,
    "energy_source": None,
    "energy_per_token_j": None,
}
"""What a ``none`` record holds beside its reason and the phase's tokens (no J/token)."""


def test_a_study_resumed_on_another_kind_of_gpu_says_so_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28's random arm, on the twin: begun on H200s, resumed where only H100s were lent.
    The resumed run says, once, that its ranking now compares kinds of GPU, and ``best``
    counts the runs of each."""
    pytest.importorskip("sglang_router")
    monkeypatch.setenv("PYTHONPATH", str(module_dir(tmp_path)))
    monkeypatch.setenv("FAKE_NVML_GPUS", "8")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # three fast configurations enqueued: the first run measures the baseline and the first,
    # the resumed run the other two (never a forbidden draw, which would launch nothing)
    fast = [FAST_CONFIG, {**FAST_CONFIG, "mem_fraction_static": 0.85}]
    fast.append({**FAST_CONFIG, "max_running_requests": 64})
    enqueue = "".join(
        "  - {" + ", ".join(f"{k}: {v}" for k, v in config.items()) + "}\n" for config in fast
    )
    study_file = _study_file(tmp_path, "cards", "remeasure: {budget: 0}\nenqueue:\n" + enqueue)
    url = f"sqlite:///{tmp_path / 'k.db'}"
    common = ["--study", "cards", "--storage", url, "--study-file", str(study_file)]
    first = autotune_cli("run", "--trials", "2", *common, cwd=tmp_path, timeout=400)
    assert "kinds of GPU" not in first.stdout + first.stderr  # one kind so far
    h100 = "NVIDIA H100 80GB HBM3"
    monkeypatch.setenv("FAKE_NVML_NAME", h100)
    resumed = autotune_cli("run", "--trials", "4", *common, cwd=tmp_path, timeout=400)
    said = resumed.stdout + resumed.stderr
    warning = (
        f"ran on 8x {h100}; the study's earlier runs on 8x NVIDIA H200 (2): its ranking now "
        "compares kinds of GPU as well as configurations"
    )
    assert said.count(warning) == 1, said  # the first H100 run only, not the second
    study = load("cards", tmp_path / "k.db")
    cards = [t.user_attrs["telemetry"]["gpus"][0]["name"] for t in study.trials]
    assert cards == ["NVIDIA H200"] * 2 + [h100] * 2, [t.user_attrs["config"] for t in study.trials]
    best = autotune_cli("best", "--study", "cards", "--storage", url, cwd=tmp_path)
    text = " ".join(best.stdout.replace("│", " ").split())
    assert f"2 kinds of GPU (8x NVIDIA H200: 2, 8x {h100}: 2 runs)" in text, text
