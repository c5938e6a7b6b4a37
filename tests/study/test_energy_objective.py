"""The ``energy`` objective: output tokens per kJ of GPU energy (1000 / J per token), higher
is better like every first objective; a trial without the figure is not scored (infeasible,
``no_telemetry``, with the reason), never given a number that would rank it."""

from __future__ import annotations

from pathlib import Path

import pytest
from optuna.study import StudyDirection

from autotune.errors import ConfigError
from autotune.results import objective_label
from autotune.study.definition import OBJECTIVES, SLOSettings, load_study_definition
from autotune.study.objectives import FAILED_LATENCY_MS, Objective
from autotune.trial.pipeline import Unscorable

REPO = Path(__file__).resolve().parents[2]
NO_NVML = "GPU telemetry: none (NVML not available: No module named 'pynvml')"
METRICS = {"output_throughput": 900.0, "tpot_ms": {"p99": 21.0}, "error_rate": 0.0}


def test_energy_scores_tokens_per_kilojoule() -> None:
    obj = Objective(kind="energy", slo=SLOSettings())
    assert obj.directions == [StudyDirection.MAXIMIZE]
    assert obj.metric_names == ["output_tok_per_kj"]
    assert obj.values({**METRICS, "energy_per_token_j": 0.4}) == [2500.0]
    pareto = Objective(kind="energy_vs_tpot", slo=SLOSettings())
    assert pareto.directions == [StudyDirection.MAXIMIZE, StudyDirection.MINIMIZE]
    assert pareto.values({**METRICS, "energy_per_token_j": 2.0}) == [500.0, 21.0]
    assert pareto.failed_values() == [0.0, FAILED_LATENCY_MS]
    assert objective_label(obj.metric_names) == ("energy efficiency", "tok/kJ")


@pytest.mark.parametrize(
    ("inputs", "why"),
    [
        ({}, "no GPU telemetry was recorded"),
        ({"energy_unknown": NO_NVML}, NO_NVML),
        ({"energy_per_token_j": 0.0}, "no GPU telemetry was recorded"),
    ],
)
def test_without_the_figure_the_trial_is_not_scored(inputs: dict, why: str) -> None:
    with pytest.raises(Unscorable) as info:
        Objective(kind="energy", slo=SLOSettings()).values({**METRICS, **inputs})
    assert info.value.failure == "no_telemetry"
    assert str(info.value) == f"the energy objective needs the GPUs' energy per output token: {why}"


def test_other_objectives_never_ask_for_it() -> None:
    for kind in OBJECTIVES:
        if kind.startswith(("throughput", "goodput")):
            assert Objective(kind=kind, slo=SLOSettings()).values({**METRICS, "goodput": 1.0})


def _study(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: s\n"
        f"space: {REPO / 'search_spaces' / 'dsv4-flash-rtx6000-pd.yaml'}\n"
        f"deployment: {REPO / 'launchers' / 'sim-dsv4-flash-pd.yaml'}\n" + text
    )
    return path


def test_a_study_file_chooses_it_and_a_wrong_name_lists_the_allowed(tmp_path: Path) -> None:
    assert load_study_definition(_study(tmp_path, "objective: energy\n")).objective == "energy"
    assert {"energy", "energy_vs_tpot", "energy_vs_ttft"} <= set(OBJECTIVES)
    with pytest.raises(ConfigError) as info:
        load_study_definition(_study(tmp_path, "objective: energy_per_token\n"))
    text = str(info.value)
    assert "field 'objective'" in text and "'energy_per_token'" in text
    assert "energy, energy_vs_tpot, energy_vs_ttft" in text
    with pytest.raises(ConfigError, match="early_abort compares a trial's live output throughput"):
        load_study_definition(_study(tmp_path, "objective: energy\nearly_abort: {}\n"))
