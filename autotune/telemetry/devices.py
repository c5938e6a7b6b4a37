"""Which GPUs a trial's telemetry samples: those of the deployment's services, on this
machine only.

NVML answers for the machine it runs on. A service started over SSH (``on:`` a host) runs
its GPUs elsewhere, and sampling this machine's instead would give figures of the wrong
hardware, so such a deployment records none, with that reason.

The services name their GPUs the way CUDA is told: ``CUDA_VISIBLE_DEVICES`` in a service's
``env`` (the bundled PD deployments give prefill ``0,1,2,3`` and decode ``4,5,6,7``). The
GPUs sampled are the union over the services that set it; a service that does not (a
router) is taken to use none. When no service sets it, the services inherit the tuner's
own ``CUDA_VISIBLE_DEVICES`` if it has one, and otherwise see every GPU: so does the
sampler. Power and energy are per GPU, so a GPU the deployment does not use would add its
idle draw (or another job's) to the trial's joules.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from autotune.specs import ServiceSpec
from autotune.telemetry.base import NoTelemetry, TelemetrySampler
from autotune.telemetry.nvml import INTERVAL_S, open_nvml

VISIBLE = "CUDA_VISIBLE_DEVICES"


def chosen_gpus(
    specs: Mapping[str, ServiceSpec], *, inherited: str | None = None
) -> tuple[str, ...] | None | str:
    """The GPUs to sample (NVML indices as text, or UUIDs), ``None`` for every GPU, or why
    none can be sampled. ``inherited``: the tuner's own ``CUDA_VISIBLE_DEVICES``."""
    remote = sorted({spec.on for spec in specs.values() if spec.on is not None})
    if remote:
        return (
            f"services run on SSH host(s) {', '.join(remote)}: NVML on this machine would "
            "measure its GPUs, not theirs"
        )
    named = {name: spec.env[VISIBLE] for name, spec in specs.items() if VISIBLE in spec.env}
    if not named and inherited is not None:
        named = {"the tuner's environment": inherited}
    if not named:
        return None
    devices: list[str] = []
    for name, value in sorted(named.items()):
        for entry in (part.strip() for part in value.split(",")):
            if not entry:
                continue
            if not (entry.isdigit() or entry.startswith("GPU-")):
                return (
                    f"{VISIBLE}={value} of {name}: {entry!r} is not a GPU index or a GPU "
                    "UUID (GPU-...) that NVML can read"
                )
            if entry not in devices:
                devices.append(entry)
    if not devices:
        return f"the services' {VISIBLE} name no GPU"
    return tuple(sorted(devices, key=lambda d: (not d.isdigit(), int(d) if d.isdigit() else 0, d)))


def gpu_sampler(
    specs: Mapping[str, ServiceSpec],
    *,
    interval_s: float = INTERVAL_S,
    cpus: frozenset[int] | None = None,
) -> TelemetrySampler:
    """The sampler for a trial's services: NVML over their GPUs, or a :class:`NoTelemetry`
    saying why not. ``cpus``: where the sampling thread runs (off the load generator's)."""
    chosen = chosen_gpus(specs, inherited=os.environ.get(VISIBLE))
    if isinstance(chosen, str):
        return NoTelemetry(chosen)
    return open_nvml(chosen, interval_s=interval_s, cpus=cpus)
