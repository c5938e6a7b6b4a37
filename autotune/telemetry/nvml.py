"""GPU telemetry through NVML: the ``pynvml`` module of NVIDIA's ``nvidia-ml-py`` package
(``pip install 'autotune[gpu]'``; the GPU image has it).

``pynvml`` is imported when a trial opens a sampler, never at import time: on a machine
without it (or without a driver, or without a GPU) :func:`open_nvml` returns a
:class:`~autotune.telemetry.base.NoTelemetry` whose reason is what NVML said
(``NVML not available: No module named 'pynvml'``, ``NVML not available: NVML Shared
Library Not Found``), and every trial records that instead of failing.

The sampling runs on its own thread, every ``interval_s`` from :meth:`NvmlSampler.begin` to
:meth:`NvmlSampler.end`, so the load generator's event loop never waits for it. Each round
reads every GPU's utilization (``nvmlDeviceGetUtilizationRates(h).gpu``, % of the last
sample period a kernel ran), memory used (``nvmlDeviceGetMemoryInfo(h).used``, bytes) and
power draw (``nvmlDeviceGetPowerUsage(h)``, milliwatts); the total-energy counter
(``nvmlDeviceGetTotalEnergyConsumption(h)``, millijoules, Volta and later) is read at both
ends of the window. A figure a GPU answers ``NVMLError_NotSupported`` for is noted once and
not asked again; any other NVML error is kept as the GPU's ``error`` and sampling goes on.

Why the counter first: on Ampere and later the power reading is an average over about the
last second, so it lags the work and the integral of the samples with it. On one H200
(driver 580, nvidia-ml-py 13.610, 2026-12-04), 6 s of bf16 matmuls read 4,169 J on the
counter against 3,835 J integrated from 0.5 s samples, and the idle 3 s right after read
389 J against 677 J (the samples still carried the matmuls' draw).

NVML numbers GPUs in PCI bus order; CUDA, unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, puts the
fastest first and breaks ties by PCI bus: the same order on a machine of identical GPUs,
which is where an index in ``CUDA_VISIBLE_DEVICES`` is taken as NVML's. A UUID
(``GPU-...``) is matched exactly.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from autotune.telemetry.base import NoTelemetry, TelemetrySampler
from autotune.telemetry.model import Reading, Telemetry, combine, summarize_gpu

INTERVAL_S = 0.5
"""Twice a second, like the servers' ``/metrics``: a measured phase of a few seconds gets
several samples, and each round costs a few NVML calls per GPU (microseconds each)."""
UTILIZATION, MEMORY, POWER, ENERGY = "utilization", "memory", "power", "energy"


def load_nvml() -> ModuleType | str:
    """The ``pynvml`` module, or why it cannot be imported."""
    try:
        return importlib.import_module("pynvml")
    except Exception as exc:  # ImportError, or an install broken in some other way
        return f"NVML not available: {exc}"


@dataclass
class _Gpu:
    handle: Any
    index: int | None
    uuid: str | None
    name: str
    memory_total: int | None
    readings: list[Reading] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)
    counter_start: int | None = None
    counter_end: int | None = None
    error: str | None = None


def open_nvml(
    devices: Sequence[str] | None,
    *,
    interval_s: float = INTERVAL_S,
    cpus: frozenset[int] | None = None,
) -> TelemetrySampler:
    """A sampler over ``devices`` (NVML indices as text, or ``GPU-...`` UUIDs; ``None``:
    every GPU NVML sees), NVML initialised; a :class:`NoTelemetry` with the reason when
    NVML or the GPUs cannot be had. ``cpus``: where the sampling thread runs."""
    nvml = load_nvml()
    if isinstance(nvml, str):
        return NoTelemetry(nvml)
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError; any other failure must not fail a trial either
        return NoTelemetry(f"NVML not available: {_why(nvml, exc)}")
    try:
        found = _find(nvml, devices)
    except Exception as exc:
        found = f"NVML could not list the GPUs: {_why(nvml, exc)}"
    if isinstance(found, str):
        _shutdown(nvml)
        return NoTelemetry(found)
    return NvmlSampler(nvml, found, interval_s=interval_s, cpus=cpus)


def _find(nvml: ModuleType, devices: Sequence[str] | None) -> list[_Gpu] | str:
    count = int(nvml.nvmlDeviceGetCount())
    if count == 0:
        return "NVML sees no GPU"
    handles: list[tuple[int | None, Any]] = []
    for entry in devices if devices is not None else [str(i) for i in range(count)]:
        if entry.isdigit():
            if int(entry) >= count:
                return (
                    f"CUDA_VISIBLE_DEVICES names GPU {entry}, but NVML sees {count} GPU(s) "
                    f"(0-{count - 1})"
                )
            handles.append((int(entry), nvml.nvmlDeviceGetHandleByIndex(int(entry))))
            continue
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(entry)
        except nvml.NVMLError as exc:
            return f"CUDA_VISIBLE_DEVICES names {entry}, which NVML does not find: {exc}"
        handles.append((_optional(nvml, nvml.nvmlDeviceGetIndex, handle), handle))
    gpus = []
    for index, handle in handles:
        memory = _optional(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
        gpus.append(
            _Gpu(
                handle=handle,
                index=index,
                uuid=_text(_optional(nvml, nvml.nvmlDeviceGetUUID, handle)),
                name=_text(_optional(nvml, nvml.nvmlDeviceGetName, handle)) or "",
                memory_total=None if memory is None else int(memory.total),
            )
        )
    return gpus


class NvmlSampler(TelemetrySampler):
    """Samples ``gpus`` on a thread of its own between :meth:`begin` and :meth:`end`, then
    shuts NVML down (it was initialised by :func:`open_nvml`)."""

    def __init__(
        self,
        nvml: ModuleType,
        gpus: list[_Gpu],
        *,
        interval_s: float = INTERVAL_S,
        cpus: frozenset[int] | None = None,
    ) -> None:
        self._nvml = nvml
        self._gpus = gpus
        self._interval_s = interval_s
        self._cpus = cpus
        self._rounds: list[list[Reading]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._crash: str | None = None
        self._closed = False
        self._result: Telemetry | None = None

    def begin(self) -> None:
        if self._thread is not None or self._closed:
            return
        self._thread = threading.Thread(target=self._run, name="gpu-telemetry", daemon=True)
        self._thread.start()

    def end(self) -> Telemetry | None:
        if self._closed:
            return self._result
        try:
            if self._thread is None:
                return None
            self._stop.set()
            self._thread.join()
            if self._crash is None:
                try:  # the window's last sample and counter reading: now
                    self._round()
                    for gpu, value in zip(self._gpus, self._counters(), strict=True):
                        gpu.counter_end = value
                except Exception as exc:
                    self._crash = f"{type(exc).__name__}: {exc}"
            self._result = self._summary()
            return self._result
        finally:
            self._closed = True
            _shutdown(self._nvml)

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        try:
            if self._cpus is not None:
                os.sched_setaffinity(0, self._cpus)  # this thread only
            for gpu, value in zip(self._gpus, self._counters(), strict=True):
                gpu.counter_start = value
            self._round()
            next_at = time.monotonic() + self._interval_s
            while not self._stop.wait(max(0.0, next_at - time.monotonic())):
                self._round()
                next_at += self._interval_s
                if next_at < time.monotonic():  # a slow round: no burst to catch up
                    next_at = time.monotonic() + self._interval_s
        except Exception as exc:  # never a traceback in the middle of a measurement
            self._crash = f"{type(exc).__name__}: {exc}"

    def _round(self) -> None:
        nvml = self._nvml
        readings = []
        for gpu in self._gpus:
            util = self._read(gpu, UTILIZATION, lambda h: nvml.nvmlDeviceGetUtilizationRates(h).gpu)
            memory = self._read(gpu, MEMORY, lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used)
            milliwatts = self._read(gpu, POWER, nvml.nvmlDeviceGetPowerUsage)
            reading = Reading(
                t=time.monotonic(),
                util_pct=None if util is None else float(util),
                memory_used_bytes=None if memory is None else int(memory),
                power_w=None if milliwatts is None else float(milliwatts) / 1000.0,
            )
            gpu.readings.append(reading)
            readings.append(reading)
        self._rounds.append(readings)

    def _counters(self) -> list[int | None]:
        """Every GPU's total-energy counter (mJ), ``None`` where it has none."""
        out = []
        for gpu in self._gpus:
            value = self._read(gpu, ENERGY, self._nvml.nvmlDeviceGetTotalEnergyConsumption)
            out.append(None if value is None else int(value))
        return out

    def _read(self, gpu: _Gpu, figure: str, call: Callable[[Any], Any]) -> Any:
        """One NVML figure of one GPU; ``None`` (and noted) when NVML refuses it."""
        if figure in gpu.unsupported:
            return None
        try:
            return call(gpu.handle)
        except self._nvml.NVMLError as exc:
            if _not_supported(self._nvml, exc):
                gpu.unsupported.add(figure)
            else:
                gpu.error = f"{figure}: {exc}"
            return None

    def _summary(self) -> Telemetry:
        if not self._rounds:
            return Telemetry.none(f"GPU sampling failed: {self._crash or 'no sample taken'}")
        gpus = [
            summarize_gpu(
                gpu.readings,
                counter_mj=(gpu.counter_start, gpu.counter_end),
                index=gpu.index,
                uuid=gpu.uuid,
                name=gpu.name,
                memory_total_bytes=gpu.memory_total,
                unsupported=sorted(gpu.unsupported),
                error=gpu.error if self._crash is None else f"sampling stopped: {self._crash}",
            )
            for gpu in self._gpus
        ]
        return combine(gpus, self._rounds, interval_s=self._interval_s)


def _not_supported(nvml: ModuleType, exc: Exception) -> bool:
    """NVML's "Not Supported" (``NVMLError_NotSupported``, code 3): this GPU lacks the
    figure for good, as opposed to a failure worth reporting."""
    cls = getattr(nvml, "NVMLError_NotSupported", None)
    if isinstance(cls, type) and isinstance(exc, cls):
        return True
    return getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3)


def _why(nvml: ModuleType, exc: Exception) -> str:
    """NVML's own words for its errors (``NVML Shared Library Not Found``), else the type."""
    if isinstance(exc, nvml.NVMLError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _optional(nvml: ModuleType, call: Callable[[Any], Any], handle: Any) -> Any:
    """A descriptive figure (name, UUID, total memory): ``None`` when NVML refuses it."""
    try:
        return call(handle)
    except nvml.NVMLError:
        return None


def _text(value: Any) -> str | None:
    """NVML's strings: ``str`` from nvidia-ml-py 11.5+, ``bytes`` from older releases."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return None if value is None else str(value)


def _shutdown(nvml: ModuleType) -> None:
    with contextlib.suppress(nvml.NVMLError):  # nothing left to release
        nvml.nvmlShutdown()
