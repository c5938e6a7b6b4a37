"""The GPUs in the HTML report and in ``autotune best``: the best trial's utilization,
peak memory, power and J/token, the top table's GPU columns, and ``none (reason)`` where
the trials were measured without NVML."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from conftest_results import BASELINE_PARAMS, TrialSpec, make_study
from e2e_helpers import autotune_cli

from autotune.report import write_report
from autotune.telemetry import Telemetry
from autotune.telemetry.model import Reading, combine, summarize_gpu

NO_NVML = "NVML not available: No module named 'pynvml'"


def measured(power_w: float, tokens: int) -> dict[str, Any]:
    """Two H200s at ``power_w`` each for 10 s (counter), ``tokens`` output tokens."""
    readings = [Reading(t=float(t), util_pct=90.0, memory_used_bytes=70 * 2**30, power_w=power_w)
                for t in (0.0, 10.0)]  # fmt: skip
    gpus = [
        summarize_gpu(readings, counter_mj=(0, int(power_w * 10_000)), index=i, name="NVIDIA H200")
        for i in range(2)
    ]
    t = combine(gpus, [[r, r] for r in readings], interval_s=0.5).with_tokens(tokens)
    return t.model_dump(mode="json")


def _study(tmp_path: Path) -> Any:
    mem = {**BASELINE_PARAMS, "mem_fraction_static": 0.80}
    return make_study(
        tmp_path,
        [
            TrialSpec(
                throughput=100.0,
                is_baseline=True,
                attrs={"telemetry": Telemetry.none(NO_NVML).model_dump(mode="json")},
            ),
            TrialSpec(throughput=900.0, params=mem, attrs={"telemetry": measured(400.0, 20_000)}),
        ],
    )


def _section(html: str, anchor: str) -> str:
    found = re.search(rf'<section id="{anchor}">(.*?)</section>', html, re.S)
    assert found is not None, anchor
    return found.group(1)


def test_the_report_shows_the_best_trials_gpus_and_the_top_tables_columns(tmp_path: Path) -> None:
    html = write_report(_study(tmp_path), path=tmp_path / "r.html").read_text(encoding="utf-8")
    summary, top = _section(html, "summary"), _section(html, "top")
    assert "<th>best trial: energy per token</th><td>0.4 J/token (8,000.0 J over 20,000" in summary
    assert "<th>best trial: GPU power</th><td>mean 800.0 W, peak 800.0 W" in summary
    assert "<th>best trial: GPU utilization</th><td>mean 90.0%, peak 90.0%</td>" in summary
    heads = re.findall(r"<th>(.*?)</th>", top)
    assert heads[5:9] == ["J/token", "GPU power W", "GPU util %", "GPU mem peak MiB"]
    rows = re.findall(r"<tr>(.*?)</tr>", top.split("<tbody>")[1], re.S)
    first = re.findall(r"<td[^>]*>(.*?)</td>", rows[0], re.S)
    assert first[1] == "1" and first[5:9] == ["0.4", "800.0", "90.0", "71,680"]
    baseline = re.findall(r"<td[^>]*>(.*?)</td>", rows[1], re.S)
    assert baseline[1] == "0 (baseline)"
    assert baseline[5] == f'<span title="none: {NO_NVML.replace(chr(39), "&#x27;")}">n/a</span>'


def test_a_study_without_telemetry_has_no_gpu_columns(tmp_path: Path) -> None:
    study = make_study(tmp_path, [TrialSpec(throughput=100.0, is_baseline=True)])
    html = write_report(study, path=tmp_path / "r.html").read_text(encoding="utf-8")
    assert "J/token" not in html and "GPU telemetry" not in html


def test_best_prints_the_gpus_or_none_with_the_reason(tmp_path: Path) -> None:
    _study(tmp_path)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    out = autotune_cli("best", "--study", "autotune-test", "--storage", url, cwd=tmp_path)
    text = " ".join(out.stdout.split())
    assert "best feasible trial #1" in text
    assert "│ GPU telemetry │ 2 GPU(s) (NVIDIA H200), 2 samples every 0.50 s over 10.0 s" in text
    assert "│ GPU utilization │ mean 90.0%, peak 90.0%" in text
    assert "│ GPU memory peak │ 71,680 MiB (fullest GPU)" in text
    assert "│ GPU power │ mean 800.0 W, peak 800.0 W (the GPUs together)" in text
    assert "│ energy per token │ 0.4 J/token (8,000.0 J over 20,000 output tokens; counter)" in text
    cpu = make_study(
        tmp_path / "cpu",
        [TrialSpec(throughput=50.0, attrs={"telemetry": Telemetry.none(NO_NVML).model_dump()})],
    )
    assert cpu.trials
    url = f"sqlite:///{tmp_path / 'cpu' / 'study.db'}"
    out = autotune_cli("best", "--study", "autotune-test", "--storage", url, cwd=tmp_path)
    assert f"│ GPU telemetry │ none ({NO_NVML})" in " ".join(out.stdout.split())
