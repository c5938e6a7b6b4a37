"""GPU telemetry through the trial pipeline, on the simulated deployment with a fake
``pynvml``: sampled over exactly the measured phase (not the warm-up, not a curve swept
after it), stored with the phase's J/token, scored by the energy objective; without NVML
every trial records none with the reason, said once, and the energy objective fails the
trial with it instead of scoring it."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fake_pynvml import FakeGpu, install
from trial_helpers import Reference

from autotune.deployment import load_deployment
from autotune.engines import get_engine
from autotune.launch import LocalLauncher
from autotune.loadgen import LoadSpec
from autotune.loadgen.capacity import SweepSpec
from autotune.space import load_space
from autotune.study.definition import SLOSettings
from autotune.study.objectives import Objective
from autotune.trial import MeasurePlan, PipelineSettings, TrialPipeline

REPO = Path(__file__).resolve().parents[2]
ENERGY = Objective(kind="energy", slo=SLOSettings())
SAMPLED = ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage")


def _pipeline(tmp_path: Path, launcher: Any, **kwargs: Any) -> TrialPipeline:
    space = load_space(REPO / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml")
    load = {"concurrency": 4, "input_len": 64, "output_len": 16, "requests": 8}
    return TrialPipeline(
        space=space,
        deployment=load_deployment(REPO / "launchers" / "sim-dsv4-flash-pd.yaml"),
        launcher=launcher,
        scorer=ENERGY,
        load=LoadSpec.model_validate(
            {
                **load,
                "warmup_requests": 4,
                "prompt": "text",
                "model": "deepseek-ai/DeepSeek-V4-Flash",
            }
        ),
        settings=PipelineSettings(trial_timeout_s=120.0),
        reference=Reference(),
        engines={s: get_engine("sglang") for s in space.services},
        run_dir=tmp_path / "run",
        **kwargs,
    )


def test_the_measured_phase_is_sampled_and_scored_in_tokens_per_kj(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("sglang_router")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake = install(monkeypatch, [FakeGpu(i, power_w=100.0 + i) for i in range(8)])
    phases: list[tuple[str, float]] = []
    warnings: list[str] = []
    with LocalLauncher(tmp_path / "run", stop_grace_s=5.0) as launcher:
        pipeline = _pipeline(
            tmp_path,
            launcher,
            plan=MeasurePlan(curve=SweepSpec(over="concurrency", points=[2])),
            on_phase=lambda name: phases.append((name, time.monotonic())),
            on_warning=warnings.append,
        )
        outcome = pipeline.evaluate(pipeline.space.baseline_config(), is_baseline=True)
    assert outcome.failure is None, outcome.record.reason
    t = outcome.record.telemetry
    assert t is not None and t.source == "nvml" and not warnings
    assert [g.index for g in t.gpus] == list(range(8))  # prefill's 0-3 and decode's 4-7
    tokens, energy, per_token = t.output_tokens, t.energy_j, t.energy_per_token_j
    assert tokens is not None and energy is not None and per_token is not None
    assert tokens == outcome.record.metrics["output_tokens"] > 0
    assert t.energy_source == "counter" and per_token == pytest.approx(energy / tokens)
    assert t.power_mean_w == pytest.approx(sum(100.0 + i for i in range(8)))
    assert outcome.values == [pytest.approx(1000.0 / per_token)]
    assert outcome.attrs["telemetry"]["energy_per_token_j"] == t.energy_per_token_j
    # every sample lies between the start of the measured phase and the curve after it
    at = {name: when for name, when in phases}
    reads = [when for when, name, _ in fake.CALLS if name in SAMPLED]
    assert reads and at["warm-up"] < at["measure"] <= min(reads)
    assert max(reads) <= at["curve"]
    assert fake.INITS == 0


def test_without_nvml_it_is_said_once_and_the_energy_objective_fails_the_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("sglang_router")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # as on a CPU machine
    warnings: list[str] = []
    with LocalLauncher(tmp_path / "run", stop_grace_s=5.0) as launcher:
        pipeline = _pipeline(tmp_path, launcher, on_warning=warnings.append)
        config = pipeline.space.baseline_config()
        outcomes = [pipeline.evaluate(config, is_baseline=True), pipeline.evaluate(config)]
    for outcome in outcomes:
        record = outcome.record
        assert record.failure == "no_telemetry" and not outcome.feasible
        assert record.reason is not None and record.reason.startswith(
            "the energy objective needs the GPUs' energy per output token: GPU telemetry: "
            "none (NVML not available: "
        )
        assert outcome.values == ENERGY.failed_values()  # not a score that would rank it
        assert record.metrics["completed"] == 8  # measured: the figures are kept
        assert record.telemetry is not None and record.telemetry.source == "none"
        assert (record.telemetry.reason or "").startswith("NVML not available: ")
    assert len(warnings) == 1 and warnings[0].startswith("GPU telemetry: none (NVML not available")
