"""What a trial stores about its GPUs (``telemetry``), and the arithmetic that gets there.

The load generator sees tokens per second; what the tokens cost is the GPUs' energy over the
same window. A trial's record keeps, per GPU and for the deployment as a whole, the mean and
peak utilization, the peak memory used, the mean and peak power draw and the energy of the
measured phase, and from that energy and the phase's output tokens the energy per output
token (J/token), the figure that compares configurations (and hardware) by what they cost.

Energy comes from NVML's total-energy counter (millijoules since the driver loaded; Volta and
later), read at both ends of the window: exact whatever the sampling interval. Where a GPU
has no counter, the power samples are integrated (trapezoids), which misses what happens
between samples. ``energy_source`` says which, so a figure is never mistaken for the other.

A machine, or a deployment, that cannot be measured stores ``source: none`` with the reason
(no NVML, no GPU, services on another host): a trial says why it has no J/token rather than
showing none, and an objective that needs it fails the trial with that reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MIB = 1024 * 1024
EnergySource = Literal["counter", "power_integral", "mixed"]


@dataclass(frozen=True)
class Reading:
    """One sample of one GPU; ``None`` where NVML did not give that figure."""

    t: float
    """``time.monotonic()`` when it was read."""
    util_pct: float | None = None
    memory_used_bytes: int | None = None
    power_w: float | None = None


class GpuTelemetry(BaseModel):
    """One GPU over the measured phase."""

    model_config = ConfigDict(extra="allow", frozen=True)

    index: int | None = None
    """NVML's index of the GPU (PCI bus order)."""
    uuid: str | None = None
    name: str = ""
    samples: int = 0
    util_mean_pct: float | None = None
    util_max_pct: float | None = None
    memory_used_max_mib: float | None = None
    memory_total_mib: float | None = None
    power_mean_w: float | None = None
    power_max_w: float | None = None
    energy_j: float | None = None
    energy_source: EnergySource | None = None
    unsupported: list[str] = Field(default_factory=list)
    """Figures NVML answered "Not Supported" for on this GPU (asked once, then left alone)."""
    error: str | None = None
    """The last other NVML error while sampling (the sampling went on)."""


def short_machine(machine: str) -> str:
    """The GPUs ``machine`` (comma-joined NVML UUIDs) by each UUID's first two parts
    (``GPU-6afddaf0``): enough to tell a session's GPUs apart."""
    return "+".join("-".join(uuid.split("-")[:2]) for uuid in machine.split(","))


class Telemetry(BaseModel):
    """A trial's ``telemetry``: the GPUs over the measured phase, or why there is none."""

    model_config = ConfigDict(extra="allow", frozen=True)

    source: Literal["nvml", "none"]
    reason: str | None = None
    """``source: none``: why nothing was measured (``NVML not available: ...``)."""
    interval_s: float | None = None
    duration_s: float | None = None
    """From the first sample to the last: the measured phase as the GPUs saw it."""
    samples: int = 0
    """Sampling rounds (each reads every GPU)."""
    gpus: list[GpuTelemetry] = Field(default_factory=list)
    util_mean_pct: float | None = None
    """Mean over the GPUs of each one's mean utilization."""
    util_max_pct: float | None = None
    memory_used_max_mib: float | None = None
    """The largest peak of any one GPU (how close the fullest came to its limit)."""
    power_mean_w: float | None = None
    """The GPUs' draw together: the sum of their means."""
    power_max_w: float | None = None
    """The highest sum over one sampling round."""
    energy_j: float | None = None
    """Every GPU's energy over the phase, summed; ``None`` when one GPU had neither a
    counter nor power samples."""
    energy_source: EnergySource | None = None
    output_tokens: int | None = None
    """The measured phase's output tokens (a capacity search: every probe's)."""
    energy_per_token_j: float | None = None

    @classmethod
    def none(cls, reason: str) -> Telemetry:
        return cls(source="none", reason=reason)

    @property
    def available(self) -> bool:
        return self.source == "nvml"

    @property
    def machine(self) -> str | None:
        """The GPUs measured (their NVML UUIDs, sorted, comma-joined): which machine a run
        was on, where a study resumed on lent hardware spans several; None without any."""
        if not self.available:
            return None
        uuids = sorted(g.uuid for g in self.gpus if g.uuid)
        return ",".join(uuids) if uuids else None

    @property
    def card(self) -> str | None:
        """The kind of GPU measured, by NVML's name ("NVIDIA H200"; "2x NVIDIA H100 80GB
        HBM3" for several of one kind; the kinds comma-joined when mixed): a study resumed
        on lent hardware may have run on more than one kind, which ``best`` and
        ``autotune run`` say. None without telemetry or without names."""
        if not self.available:
            return None
        names = [g.name for g in self.gpus if g.name]
        if not names:
            return None
        kinds = []
        for name in sorted(set(names)):
            count = names.count(name)
            kinds.append(f"{count}x {name}" if count > 1 else name)
        return ", ".join(kinds)

    def with_tokens(self, output_tokens: int) -> Telemetry:
        """This telemetry with the phase's output tokens and J/token (``None`` without
        energy or tokens)."""
        per_token = None
        if self.energy_j is not None and self.energy_j > 0 and output_tokens > 0:
            per_token = self.energy_j / output_tokens
        return self.model_copy(
            update={"output_tokens": output_tokens, "energy_per_token_j": per_token}
        )

    def energy_missing(self) -> str | None:
        """Why there is no J/token, in words; ``None`` when there is one."""
        if self.energy_per_token_j is not None:
            return None
        if not self.available:
            return f"GPU telemetry: none ({self.reason or 'no reason recorded'})"
        if self.energy_j is None:
            missing = [g.name or f"GPU {g.index}" for g in self.gpus if g.energy_j is None]
            return "no energy reading: neither NVML's energy counter nor power samples on " + (
                ", ".join(missing) or "the GPUs"
            )
        if self.energy_j <= 0:
            return "the GPUs' energy did not advance over the measured phase"
        return "the measured phase produced no output token"

    def score_inputs(self) -> dict[str, Any]:
        """What the scorer reads: ``energy_per_token_j``, or ``energy_unknown`` (why not)."""
        missing = self.energy_missing()
        if missing is None:
            return {"energy_per_token_j": self.energy_per_token_j}
        return {"energy_unknown": missing}

    def rows(self) -> list[tuple[str, str]]:
        """(label, text) lines for ``best`` and the report: what was sampled, utilization,
        peak memory, power and J/token; one line saying why when there is nothing."""
        if not self.available:
            return [("GPU telemetry", f"none ({self.reason or 'no reason recorded'})")]
        names = sorted({g.name for g in self.gpus if g.name})
        rows = [
            (
                "GPU telemetry",
                f"{len(self.gpus)} GPU(s)"
                + (f" ({', '.join(names)})" if names else "")
                + f", {self.samples} samples every {_num(self.interval_s, 2)} s over "
                f"{_num(self.duration_s)} s",
            )
        ]
        if self.util_mean_pct is not None:
            rows.append(
                (
                    "GPU utilization",
                    f"mean {_num(self.util_mean_pct)}%, peak {_num(self.util_max_pct)}%",
                )
            )
        if self.memory_used_max_mib is not None:
            total = max((g.memory_total_mib or 0.0 for g in self.gpus), default=0.0)
            of = f" of {total:,.0f} MiB" if total else ""
            rows.append(
                ("GPU memory peak", f"{self.memory_used_max_mib:,.0f} MiB{of} (fullest GPU)")
            )
        if self.power_mean_w is not None:
            rows.append(
                (
                    "GPU power",
                    f"mean {_num(self.power_mean_w)} W, peak {_num(self.power_max_w)} W "
                    "(the GPUs together)",
                )
            )
        unsupported = sorted({f for g in self.gpus for f in g.unsupported})
        if unsupported:
            rows.append(("not supported by NVML", ", ".join(unsupported)))
        if self.energy_per_token_j is not None and self.energy_j is not None:
            source = (self.energy_source or "").replace("_", " ")
            text = (
                f"{self.energy_per_token_j:.4g} J/token ({self.energy_j:,.1f} J over "
                f"{self.output_tokens or 0:,} output tokens; {source})"
            )
        else:
            text = f"unknown: {self.energy_missing()}"
        rows.append(("energy per token", text))
        return rows

    def describe(self) -> str:
        """:meth:`rows` as one line (``none (reason)`` when nothing was measured)."""
        if not self.available:
            return self.rows()[0][1]
        return "; ".join(f"{label} {text}" for label, text in self.rows())


def _num(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def integrate_power(readings: Sequence[Reading]) -> float | None:
    """Joules under the power samples (trapezoids between consecutive ones); ``None`` with
    fewer than two."""
    points = [(r.t, r.power_w) for r in readings if r.power_w is not None]
    if len(points) < 2:
        return None
    return sum(
        (t1 - t0) * (p0 + p1) / 2.0 for (t0, p0), (t1, p1) in zip(points, points[1:], strict=False)
    )


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize_gpu(
    readings: Sequence[Reading],
    *,
    counter_mj: tuple[int | None, int | None] = (None, None),
    index: int | None = None,
    uuid: str | None = None,
    name: str = "",
    memory_total_bytes: int | None = None,
    unsupported: Sequence[str] = (),
    error: str | None = None,
) -> GpuTelemetry:
    """One GPU's figures from its samples; energy from the counter's readings at both ends
    (``counter_mj``, millijoules) when both exist and it did not go backwards (a driver
    reload restarts it), else from the power samples."""
    util = [r.util_pct for r in readings if r.util_pct is not None]
    memory = [r.memory_used_bytes for r in readings if r.memory_used_bytes is not None]
    power = [r.power_w for r in readings if r.power_w is not None]
    start, end = counter_mj
    energy: float | None
    source: EnergySource | None
    if start is not None and end is not None and end >= start:
        energy, source = (end - start) / 1000.0, "counter"
    else:
        energy = integrate_power(readings)
        source = None if energy is None else "power_integral"
    return GpuTelemetry(
        index=index,
        uuid=uuid,
        name=name,
        samples=len(readings),
        util_mean_pct=_mean(util),
        util_max_pct=max(util) if util else None,
        memory_used_max_mib=max(memory) / MIB if memory else None,
        memory_total_mib=None if memory_total_bytes is None else memory_total_bytes / MIB,
        power_mean_w=_mean(power),
        power_max_w=max(power) if power else None,
        energy_j=energy,
        energy_source=source,
        unsupported=sorted(unsupported),
        error=error,
    )


def combine(
    gpus: Sequence[GpuTelemetry],
    rounds: Sequence[Sequence[Reading]],
    *,
    interval_s: float,
) -> Telemetry:
    """The deployment's figures from each GPU's (``rounds[i][g]``: round ``i``'s reading of
    GPU ``g``; a round's total power counts only when every GPU gave one)."""
    stamps = [r.t for round_ in rounds for r in round_]
    utils = [g.util_mean_pct for g in gpus if g.util_mean_pct is not None]
    peaks = [g.util_max_pct for g in gpus if g.util_max_pct is not None]
    memory = [g.memory_used_max_mib for g in gpus if g.memory_used_max_mib is not None]
    means = [g.power_mean_w for g in gpus]
    totals = [
        sum(p for p in powers if p is not None)
        for powers in ([r.power_w for r in round_] for round_ in rounds)
        if powers and None not in powers
    ]
    energies = [g.energy_j for g in gpus]
    sources = {g.energy_source for g in gpus}
    energy = None if not gpus or None in energies else sum(e for e in energies if e is not None)
    source: EnergySource | None = None
    if energy is not None:
        source = sources.pop() if len(sources) == 1 else "mixed"
    return Telemetry(
        source="nvml",
        interval_s=interval_s,
        duration_s=max(stamps) - min(stamps) if stamps else None,
        samples=len(rounds),
        gpus=list(gpus),
        util_mean_pct=_mean(utils),
        util_max_pct=max(peaks) if peaks else None,
        memory_used_max_mib=max(memory) if memory else None,
        power_mean_w=(
            None if not means or None in means else sum(m for m in means if m is not None)
        ),
        power_max_w=max(totals) if totals else None,
        energy_j=energy,
        energy_source=source,
    )
