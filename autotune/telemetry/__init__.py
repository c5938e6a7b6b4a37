"""GPU telemetry of a trial's measured phase: utilization, memory, power and energy per GPU,
sampled through NVML on a thread of its own, and the energy per output token (J/token).

* :mod:`~autotune.telemetry.model`: what a trial stores (:class:`Telemetry`) and the
  arithmetic from samples to it;
* :mod:`~autotune.telemetry.base`: the narrow sampler interface the pipeline uses, and
  :class:`NoTelemetry` for a machine or deployment that cannot be measured;
* :mod:`~autotune.telemetry.nvml`: the NVML sampler (``pynvml`` imported lazily: the
  ``gpu`` extra, ``nvidia-ml-py``);
* :mod:`~autotune.telemetry.devices`: which GPUs a trial's services use, and whether they
  are on this machine at all.

Sits beside the load generator: it knows the rendered service specs, nothing above them.
"""

from __future__ import annotations

from autotune.telemetry.base import NoTelemetry, TelemetrySampler
from autotune.telemetry.devices import chosen_gpus, gpu_sampler
from autotune.telemetry.model import GpuTelemetry, Reading, Telemetry, short_machine
from autotune.telemetry.nvml import INTERVAL_S, NvmlSampler, open_nvml

__all__ = [
    "INTERVAL_S",
    "GpuTelemetry",
    "NoTelemetry",
    "NvmlSampler",
    "Reading",
    "Telemetry",
    "TelemetrySampler",
    "chosen_gpus",
    "gpu_sampler",
    "open_nvml",
    "short_machine",
]
