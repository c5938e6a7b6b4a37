"""The NVML sampler against a fake ``pynvml`` (tests/fake_pynvml.py): what it reads, when,
the energy counter and its fallback, the figures a GPU does not support, and every way
NVML can be missing (which records none, with the reason, instead of failing)."""

from __future__ import annotations

import sys
import time
from types import ModuleType

import pytest
from fake_pynvml import FakeGpu, install

from autotune.telemetry import NoTelemetry, NvmlSampler, open_nvml

FAST = 0.05
SAMPLED = ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage")


def _sampled(fake: ModuleType, gpu: int | None = None) -> list[float]:
    return [t for t, name, index in fake.CALLS if name in SAMPLED and (gpu is None or index == gpu)]


def test_every_gpu_is_sampled_and_the_energy_counter_gives_the_joules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = install(monkeypatch, [FakeGpu(0, power_w=300.0), FakeGpu(1, power_w=500.0, util_pct=40)])
    sampler = open_nvml(None, interval_s=FAST)
    assert isinstance(sampler, NvmlSampler) and sampler.none_reason is None
    sampler.begin()
    time.sleep(0.4)
    t = sampler.end()
    assert t is not None and t.source == "nvml"
    assert t.interval_s == FAST and t.samples >= 5  # 0.4 s at 0.05 s, plus the closing one
    assert [g.index for g in t.gpus] == [0, 1] and t.gpus[0].uuid == "GPU-fake-0000"
    first, second = t.gpus
    assert first.name == "NVIDIA H200" and first.samples == t.samples
    assert (first.power_mean_w, first.power_max_w) == (300.0, 300.0)  # mW -> W
    assert (second.util_mean_pct, second.util_max_pct) == (40.0, 40.0)
    assert first.memory_used_max_mib == 100 * 1024 and first.memory_total_mib == 141 * 1024
    assert t.power_mean_w == 800.0 and t.power_max_w == 800.0
    assert first.energy_source == second.energy_source == t.energy_source == "counter"
    assert t.duration_s is not None and 0.35 < t.duration_s < 2.0  # 0.4 s; a busy machine
    # the counter's difference over the window: power x (a little more than) the samples' span
    assert first.energy_j == pytest.approx(300.0 * t.duration_s, rel=0.05)
    assert t.energy_j == pytest.approx(800.0 * t.duration_s, rel=0.05)
    assert fake.INITS == 0  # shut down again


def test_it_reads_the_gpus_only_between_begin_and_end(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, [FakeGpu(0), FakeGpu(1)])
    sampler = open_nvml(None, interval_s=FAST)
    opened = {name for _, name, _ in fake.CALLS}
    assert opened.isdisjoint({*SAMPLED, "nvmlDeviceGetTotalEnergyConsumption"})  # names only
    time.sleep(0.15)
    assert not _sampled(fake)  # opened, not begun: nothing sampled
    began = time.monotonic()
    sampler.begin()
    time.sleep(0.2)
    sampler.end()
    ended = time.monotonic()
    reads = _sampled(fake)
    assert reads and began <= min(reads) and max(reads) <= ended
    energy = [c for c in fake.CALLS if c[1] == "nvmlDeviceGetTotalEnergyConsumption"]
    assert len(energy) == 4  # each GPU's counter at the start and at the end, nothing between
    time.sleep(0.15)
    assert len(_sampled(fake)) == len(reads)  # stopped
    assert sampler.end() is not None and len(_sampled(fake)) == len(reads)  # idempotent


def test_without_an_energy_counter_the_power_samples_are_integrated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    install(monkeypatch, [FakeGpu(0, power_w=250.0, energy=False)])  # pre-Volta
    sampler = open_nvml(None, interval_s=FAST)
    sampler.begin()
    time.sleep(0.3)
    t = sampler.end()
    assert t is not None and t.gpus[0].unsupported == ["energy"]
    assert t.energy_source == "power_integral"
    assert t.duration_s is not None
    assert t.energy_j == pytest.approx(250.0 * t.duration_s, rel=1e-6)  # constant draw: exact


def test_a_figure_not_supported_is_asked_once_and_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    no_util = FakeGpu(0, unsupported={"nvmlDeviceGetUtilizationRates"})
    fake = install(monkeypatch, [no_util, FakeGpu(1)])
    sampler = open_nvml(None, interval_s=FAST)
    sampler.begin()
    time.sleep(0.25)
    t = sampler.end()
    assert t is not None
    asked = [c for c in fake.CALLS if c[1] == "nvmlDeviceGetUtilizationRates" and c[2] == 0]
    assert len(asked) == 1
    assert t.gpus[0].unsupported == ["utilization"] and t.gpus[0].util_mean_pct is None
    assert t.gpus[0].power_mean_w == 500.0 and t.gpus[0].error is None  # the rest was read
    assert t.gpus[1].util_mean_pct == 80.0 and t.util_mean_pct == 80.0
    assert dict(t.rows())["not supported by NVML"] == "utilization"


def test_another_nvml_error_is_kept_and_sampling_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, [FakeGpu(0, failing={"nvmlDeviceGetPowerUsage"})])
    sampler = open_nvml(None, interval_s=FAST)
    sampler.begin()
    time.sleep(0.2)
    t = sampler.end()
    assert t is not None and t.samples >= 3
    assert t.gpus[0].error == "power: Unknown Error" and t.gpus[0].power_mean_w is None
    assert t.gpus[0].util_mean_pct == 80.0 and t.energy_source == "counter"
    assert t.power_mean_w is None  # a sum missing one GPU is no total


@pytest.mark.parametrize(
    ("gpus", "fail_init", "devices", "reason"),
    [
        ([FakeGpu(0)], 12, None, "NVML not available: NVML Shared Library Not Found"),
        ([], None, None, "NVML sees no GPU"),
        (
            [FakeGpu(0)],
            None,
            ("0", "3"),
            "CUDA_VISIBLE_DEVICES names GPU 3, but NVML sees 1 GPU(s) (0-0)",
        ),
        (
            [FakeGpu(0)],
            None,
            ("GPU-nope",),
            "CUDA_VISIBLE_DEVICES names GPU-nope, which NVML does not find: Unknown Error",
        ),
    ],
)
def test_no_nvml_or_no_such_gpu_is_none_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
    gpus: list[FakeGpu],
    fail_init: int | None,
    devices: tuple[str, ...] | None,
    reason: str,
) -> None:
    fake = install(monkeypatch, gpus, fail_init=fail_init)
    sampler = open_nvml(devices)
    assert isinstance(sampler, NoTelemetry) and sampler.none_reason == reason
    assert fake.INITS == 0  # whatever was initialised was shut down
    assert sampler.end() is None  # never begun: nothing to store
    sampler.begin()
    t = sampler.end()
    assert t is not None and t.source == "none" and t.reason == reason and not t.gpus


def test_without_pynvml_it_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # what an import of a missing module meets
    sampler = open_nvml(None)
    assert isinstance(sampler, NoTelemetry)
    assert (sampler.none_reason or "").startswith("NVML not available: ")
    assert "pynvml" in (sampler.none_reason or "")


def test_devices_by_index_or_uuid_and_never_begun(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, [FakeGpu(i) for i in range(4)])
    sampler = open_nvml(("2", "GPU-fake-0000"), interval_s=FAST)
    sampler.begin()
    time.sleep(0.1)
    t = sampler.end()
    assert t is not None and [g.index for g in t.gpus] == [2, 0]
    assert {i for _, name, i in fake.CALLS if name in SAMPLED} == {0, 2}
    never = open_nvml(None)
    assert never.end() is None and fake.INITS == 0  # opened, never begun: shut down
