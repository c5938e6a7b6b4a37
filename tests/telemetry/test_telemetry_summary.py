"""The arithmetic from GPU samples to what a trial stores: per-GPU means and peaks, energy
from the counter or the power integral, the deployment's totals, J/token, and the lines
``best`` and the report print."""

from __future__ import annotations

import pytest

from autotune.telemetry import Reading, Telemetry
from autotune.telemetry.model import MIB, combine, integrate_power, summarize_gpu
from autotune.trial.record import SCHEMA_VERSION, TrialRecord


def _readings(powers: list[float | None], *, step: float = 0.5) -> list[Reading]:
    return [
        Reading(
            t=100.0 + i * step, util_pct=50.0 + 10 * i, memory_used_bytes=(i + 1) * MIB, power_w=p
        )
        for i, p in enumerate(powers)
    ]


def test_the_power_integral_is_trapezoids_between_samples() -> None:
    # 100 W for 0.5 s, then a ramp to 300 W over 0.5 s: 50 J + 100 J
    assert integrate_power(_readings([100.0, 100.0, 300.0])) == pytest.approx(150.0)
    assert integrate_power(_readings([100.0])) is None  # one sample spans no time
    assert integrate_power(_readings([None, 100.0, None])) is None
    # a sample without power is skipped, its neighbours joined
    assert integrate_power(_readings([100.0, None, 100.0])) == pytest.approx(100.0)


def test_one_gpu_means_peaks_and_the_energy_counter() -> None:
    gpu = summarize_gpu(
        _readings([200.0, 400.0, 300.0]),
        counter_mj=(1_000_000, 1_450_500),
        index=3,
        name="NVIDIA H200",
        memory_total_bytes=141 * 1024 * MIB,
    )
    assert gpu.samples == 3
    assert (gpu.util_mean_pct, gpu.util_max_pct) == (60.0, 70.0)
    assert gpu.memory_used_max_mib == 3.0 and gpu.memory_total_mib == 141 * 1024
    assert (gpu.power_mean_w, gpu.power_max_w) == (300.0, 400.0)
    assert (gpu.energy_j, gpu.energy_source) == (450.5, "counter")  # mJ -> J, not the integral


def test_without_a_counter_or_when_it_went_back_the_power_is_integrated() -> None:
    readings = _readings([200.0, 200.0, 200.0])  # 1 s at 200 W
    for counter in ((None, None), (5_000, None), (9_000, 1_000)):  # none, half, a reload
        gpu = summarize_gpu(readings, counter_mj=counter)
        assert (gpu.energy_j, gpu.energy_source) == (pytest.approx(200.0), "power_integral")
    assert summarize_gpu(_readings([None, None]), counter_mj=(None, None)).energy_j is None


def test_the_deployment_sums_power_and_energy_and_takes_the_fullest_gpu() -> None:
    a = _readings([100.0, 300.0])
    b = _readings([200.0, None])  # its second power reading failed
    gpus = [
        summarize_gpu(a, counter_mj=(0, 100_000), index=0),
        summarize_gpu(b, counter_mj=(0, 50_000), index=1),
    ]
    t = combine(gpus, [[a[0], b[0]], [a[1], b[1]]], interval_s=0.5)
    assert t.source == "nvml" and t.samples == 2 and t.interval_s == 0.5
    assert t.duration_s == pytest.approx(0.5)
    assert t.power_mean_w == 200.0 + 200.0  # each GPU's mean, summed
    assert t.power_max_w == 300.0  # round 1 (100 + 200); round 2 has no total without b's
    assert (t.energy_j, t.energy_source) == (150.0, "counter")
    assert t.util_mean_pct == 55.0 and t.util_max_pct == 60.0
    assert t.memory_used_max_mib == 2.0
    mixed = combine(
        [gpus[0], summarize_gpu(a, counter_mj=(None, None), index=1)], [a, a], interval_s=0.5
    )
    assert mixed.energy_source == "mixed" and mixed.energy_j == pytest.approx(100.0 + 100.0)
    unknown = combine([gpus[0], summarize_gpu(_readings([None]), index=1)], [a], interval_s=0.5)
    assert unknown.energy_j is None and unknown.energy_source is None


def test_joules_per_token_and_why_there_is_none() -> None:
    t = Telemetry(source="nvml", energy_j=600.0, energy_source="counter")
    assert t.with_tokens(1200).energy_per_token_j == 0.5
    assert t.with_tokens(1200).score_inputs() == {"energy_per_token_j": 0.5}
    assert t.with_tokens(0).energy_missing() == "the measured phase produced no output token"
    still = Telemetry(source="nvml", energy_j=0.0).with_tokens(100)
    assert still.energy_per_token_j is None  # never 0 J/token: that would win
    assert "did not advance" in (still.energy_missing() or "")
    none = Telemetry.none("NVML not available: No module named 'pynvml'").with_tokens(100)
    assert none.score_inputs() == {
        "energy_unknown": "GPU telemetry: none (NVML not available: No module named 'pynvml')"
    }


def test_best_and_the_report_lines() -> None:
    readings = _readings([300.0, 300.0])
    gpus = [
        summarize_gpu(readings, counter_mj=(0, 300_000), index=i, name="H200") for i in range(2)
    ]
    t = combine(gpus, [[r, r] for r in readings], interval_s=0.5)
    rows = dict(t.with_tokens(1000).rows())
    assert rows["GPU telemetry"] == "2 GPU(s) (H200), 2 samples every 0.50 s over 0.5 s"
    assert rows["GPU utilization"] == "mean 55.0%, peak 60.0%"
    assert rows["GPU memory peak"].startswith("2 MiB")
    assert rows["GPU power"] == "mean 600.0 W, peak 600.0 W (the GPUs together)"
    assert rows["energy per token"] == "0.6 J/token (600.0 J over 1,000 output tokens; counter)"
    none = Telemetry.none("NVML sees no GPU")
    assert none.rows() == [("GPU telemetry", "none (NVML sees no GPU)")]
    assert none.describe() == "none (NVML sees no GPU)"
    assert "J/token unknown" not in t.with_tokens(1000).describe()


def test_a_trial_record_stores_it_and_an_old_one_reads_without_it() -> None:
    t = Telemetry(source="nvml", energy_j=10.0, energy_source="counter").with_tokens(20)
    record = TrialRecord(telemetry=t)
    attrs = record.to_attrs()
    assert attrs["schema_version"] == SCHEMA_VERSION >= 6
    assert attrs["telemetry"]["energy_per_token_j"] == 0.5
    assert TrialRecord.from_attrs(attrs).telemetry == t
    old = {"schema_version": 5, "config": {"a": 1}, "metrics": {"output_throughput": 1.0}}
    assert TrialRecord.from_attrs(old).telemetry is None
    assert "telemetry" not in TrialRecord.from_attrs(old).to_attrs()
    newer = {**attrs, "telemetry": {**attrs["telemetry"], "clock_mhz_max": 1980}}
    assert TrialRecord.from_attrs(newer).to_attrs()["telemetry"]["clock_mhz_max"] == 1980
