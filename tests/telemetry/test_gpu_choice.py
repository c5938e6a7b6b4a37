"""Which GPUs a trial samples: those the services name in CUDA_VISIBLE_DEVICES (a router
that names none uses none), the tuner's own otherwise, every GPU when nothing says; and
none at all, with the reason, when a service runs on another host."""

from __future__ import annotations

import time

import pytest
from fake_pynvml import FakeGpu, install

from autotune.specs import ServiceSpec
from autotune.telemetry import NoTelemetry, NvmlSampler, chosen_gpus, gpu_sampler


def _spec(name: str, env: dict[str, str] | None = None, on: str | None = None) -> ServiceSpec:
    return ServiceSpec(
        name=name,
        argv=("serve",),
        env=env or {},
        port=8000,
        health_url="http://127.0.0.1:8000/health",
        log_file=f"{name}.log",
        on=on,
        manager="local" if on is None else "process",
    )


PD = {
    "prefill": _spec("prefill", {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}),
    "decode": _spec("decode", {"CUDA_VISIBLE_DEVICES": "7, 6,5,4"}),
    "router": _spec("router"),
}


def test_the_services_gpus_in_order() -> None:
    assert chosen_gpus(PD) == ("0", "1", "2", "3", "4", "5", "6", "7")
    shared = {**PD, "decode": _spec("decode", {"CUDA_VISIBLE_DEVICES": "2,3,GPU-abc"})}
    assert chosen_gpus(shared, inherited="0") == ("0", "1", "2", "3", "GPU-abc")


def test_the_tuners_own_devices_or_every_gpu_when_no_service_names_any() -> None:
    plain = {"server": _spec("server"), "router": _spec("router")}
    assert chosen_gpus(plain) is None
    assert chosen_gpus(plain, inherited="1,3") == ("1", "3")


def test_what_cannot_be_sampled_says_why() -> None:
    remote = {**PD, "decode": _spec("decode", {"CUDA_VISIBLE_DEVICES": "0"}, on="gpu-b")}
    assert chosen_gpus(remote) == (
        "services run on SSH host(s) gpu-b: NVML on this machine would measure its GPUs, not theirs"
    )
    mig = {"w": _spec("w", {"CUDA_VISIBLE_DEVICES": "MIG-1234"})}
    assert "'MIG-1234' is not a GPU index or a GPU UUID" in str(chosen_gpus(mig))
    assert chosen_gpus({"w": _spec("w", {"CUDA_VISIBLE_DEVICES": ""})}) == (
        "the services' CUDA_VISIBLE_DEVICES name no GPU"
    )


def test_the_sampler_for_a_deployment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake = install(monkeypatch, [FakeGpu(i) for i in range(8)])
    remote = gpu_sampler({"w": _spec("w", on="gpu-a")})
    assert isinstance(remote, NoTelemetry) and "gpu-a" in (remote.none_reason or "")
    assert fake.INITS == 0  # NVML never opened for a remote deployment
    one = {"w": _spec("w", {"CUDA_VISIBLE_DEVICES": "5"}), "router": _spec("router")}
    sampler = gpu_sampler(one, interval_s=0.05)
    assert isinstance(sampler, NvmlSampler)
    sampler.begin()
    time.sleep(0.1)
    t = sampler.end()
    assert t is not None and [g.index for g in t.gpus] == [5]
    assert {i for _, name, i in fake.CALLS if name == "nvmlDeviceGetPowerUsage"} == {5}
