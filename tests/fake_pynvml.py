"""A fake ``pynvml`` (the module of NVIDIA's nvidia-ml-py) for the tests of GPU telemetry.

The functions autotune calls, under their real names, with their real units (power in mW,
energy in mJ, memory in bytes) and errors (``NVMLError`` with ``value``, the
``NVMLError_NotSupported`` subclass, "NVML Shared Library Not Found" when the library is
missing), over GPUs the test describes. Every device query is logged with its
``time.monotonic()``, so a test can say when sampling happened.

Two ways in: :func:`install` puts a fresh copy in ``sys.modules['pynvml']`` for a test in
this process; a process the tests start imports this file as ``pynvml`` from a directory
on its ``PYTHONPATH`` (:func:`module_dir`), configured by ``FAKE_NVML_*`` variables
(``FAKE_NVML_NAME``: the GPUs' name, "NVIDIA H200" by default).

Energy: each GPU's counter grows by its power draw times the time since the fake was
configured, so a window's counter difference is exactly power x duration.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _STRINGS.get(self.value, f"NVML Error with code {self.value}")


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's own name
    def __init__(self, *_: object) -> None:
        super().__init__(NVML_ERROR_NOT_SUPPORTED)


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801
    def __init__(self, *_: object) -> None:
        super().__init__(NVML_ERROR_LIBRARY_NOT_FOUND)


@dataclass
class FakeGpu:
    index: int
    name: str = "NVIDIA H200"
    power_w: float = 500.0
    util_pct: int = 80
    memory_used: int = 100 * 2**30
    memory_total: int = 141 * 2**30
    energy: bool = True
    """Whether nvmlDeviceGetTotalEnergyConsumption is supported (Volta and later)."""
    unsupported: set[str] = field(default_factory=set)
    """Functions (by name) that raise NVMLError_NotSupported on this GPU."""
    failing: set[str] = field(default_factory=set)
    """Functions that raise another NVMLError (Unknown Error)."""
    machine: str = "fake"
    """Part of the UUID: GPUs of another (fake) machine have other UUIDs."""

    @property
    def uuid(self) -> str:
        return f"GPU-{self.machine}-{self.index:04d}"


_lock = threading.Lock()
GPUS: list[FakeGpu] = []
CALLS: list[tuple[float, str, int]] = []
"""(time.monotonic(), function, GPU index) of every device query."""
STARTED = 0.0
INITS = 0
"""nvmlInit calls not yet matched by nvmlShutdown."""
FAIL_INIT: int | None = None


def configure(gpus: list[FakeGpu] | None = None, *, fail_init: int | None = None) -> None:
    global STARTED, INITS, FAIL_INIT
    GPUS[:] = gpus if gpus is not None else [FakeGpu(0)]
    CALLS.clear()
    STARTED = time.monotonic()
    INITS = 0
    FAIL_INIT = fail_init


def _from_environment() -> None:
    count = int(os.environ.get("FAKE_NVML_GPUS", "1"))
    power = float(os.environ.get("FAKE_NVML_POWER_W", "500"))
    energy = os.environ.get("FAKE_NVML_NO_ENERGY") != "1"
    fail = os.environ.get("FAKE_NVML_FAIL_INIT")
    # FAKE_NVML_NAME: another kind of card (and another machine: its own UUIDs)
    name = os.environ.get("FAKE_NVML_NAME", "NVIDIA H200")
    machine = "fake" if name == "NVIDIA H200" else f"fake{zlib.crc32(name.encode()) % 10_000:04d}"
    configure(
        [
            FakeGpu(i, name=name, power_w=power, energy=energy, machine=machine)
            for i in range(count)
        ],
        fail_init=int(fail) if fail else None,
    )


def _query(name: str, handle: Any) -> FakeGpu:
    if INITS <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    gpu: FakeGpu = handle
    with _lock:
        CALLS.append((time.monotonic(), name, gpu.index))
    if name in gpu.unsupported:
        raise NVMLError_NotSupported()
    if name in gpu.failing:
        raise NVMLError(NVML_ERROR_UNKNOWN)
    return gpu


def nvmlInit() -> None:
    global INITS
    if FAIL_INIT is not None:
        raise NVMLError_LibraryNotFound() if FAIL_INIT == 12 else NVMLError(FAIL_INIT)
    INITS += 1


def nvmlShutdown() -> None:
    global INITS
    if INITS <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    INITS -= 1


def nvmlDeviceGetCount() -> int:
    if INITS <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return len(GPUS)


def nvmlDeviceGetHandleByIndex(index: int) -> FakeGpu:
    if INITS <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return GPUS[index]


def nvmlDeviceGetHandleByUUID(uuid: str) -> FakeGpu:
    for gpu in GPUS:
        if gpu.uuid == uuid:
            return gpu
    raise NVMLError(NVML_ERROR_UNKNOWN)


def nvmlDeviceGetIndex(handle: Any) -> int:
    return _query("nvmlDeviceGetIndex", handle).index


def nvmlDeviceGetName(handle: Any) -> str:
    return _query("nvmlDeviceGetName", handle).name


def nvmlDeviceGetUUID(handle: Any) -> str:
    return _query("nvmlDeviceGetUUID", handle).uuid


def nvmlDeviceGetMemoryInfo(handle: Any) -> SimpleNamespace:
    gpu = _query("nvmlDeviceGetMemoryInfo", handle)
    used = gpu.memory_used
    return SimpleNamespace(total=gpu.memory_total, free=gpu.memory_total - used, used=used)


def nvmlDeviceGetUtilizationRates(handle: Any) -> SimpleNamespace:
    gpu = _query("nvmlDeviceGetUtilizationRates", handle)
    return SimpleNamespace(gpu=gpu.util_pct, memory=gpu.util_pct // 2)


def nvmlDeviceGetPowerUsage(handle: Any) -> int:
    return int(round(_query("nvmlDeviceGetPowerUsage", handle).power_w * 1000))


def nvmlDeviceGetTotalEnergyConsumption(handle: Any) -> int:
    gpu = _query("nvmlDeviceGetTotalEnergyConsumption", handle)
    if not gpu.energy:
        raise NVMLError_NotSupported()
    return 7_000_000 + int(gpu.power_w * (time.monotonic() - STARTED) * 1000)


READS = (
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption",
)
"""What sampling asks (nvmlDeviceGetMemoryInfo is also asked once when the sampler opens,
for the total)."""


def install(monkeypatch: Any, gpus: list[FakeGpu] | None = None, **kwargs: Any) -> ModuleType:
    """A fresh copy of this module as ``pynvml`` for one test (``monkeypatch`` restores)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("pynvml", __file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "pynvml", module)  # before it runs: its dataclasses
    spec.loader.exec_module(module)
    module.configure(gpus, **kwargs)
    return module


def module_dir(tmp: Path) -> Path:
    """A directory holding this file as ``pynvml.py``: put it on a child's PYTHONPATH."""
    target = tmp / "fake-nvml"
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(__file__, target / "pynvml.py")
    return target


if __name__ == "pynvml":  # imported as pynvml by a process the tests started
    _from_environment()
