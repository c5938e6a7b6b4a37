"""What a trial measures on its running deployment: one load, or a capacity search, and
optionally a latency-throughput curve after it.

The pipeline hands the deployment's endpoint here once it is up and correct; everything
comes back on the modeled hardware's clock (a simulated deployment runs ``speedup`` x
faster: rates and latencies are converted, concurrencies are not). The load spec and the
search arrive on the wall clock already (the study converts its SLO limits and rates).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from autotune.errors import BenchError
from autotune.loadgen import AbortRule, LoadSpec, rescale_time, run_load
from autotune.loadgen.capacity import CapacitySearch, SweepSpec, find_capacity, sweep
from autotune.loadgen.client import PhaseCallback, ProgressCallback
from autotune.loadgen.metrics import Metrics


@dataclass(frozen=True)
class MeasurePlan:
    """``capacity``: search the highest passing load instead of measuring ``load`` once;
    ``curve``: then record a sweep on the same processes."""

    capacity: CapacitySearch | None = None
    curve: SweepSpec | None = None

    def on_wall_clock(self, speedup: float) -> MeasurePlan:
        """The plan with its rates (given for the modeled hardware) on the wall clock."""
        if speedup == 1.0:
            return self
        capacity, curve = self.capacity, self.curve
        if capacity is not None and capacity.over == "rate":
            capacity = capacity.model_copy(
                update={
                    k: None if getattr(capacity, k) is None else getattr(capacity, k) * speedup
                    for k in ("start", "limit", "floor")
                }
            )
        if curve is not None and curve.over == "rate":
            curve = curve.model_copy(update={"points": [p * speedup for p in curve.points]})
        return MeasurePlan(capacity=capacity, curve=curve)


@dataclass
class Measured:
    """One trial's measurement, on the modeled clock."""

    metrics: Metrics
    """The load's metrics; for a capacity search, the probe at capacity (or, when none
    passed, the last probe: its SLO violations make the trial infeasible)."""
    warmup_seconds: float
    measure_seconds: float
    stop_reason: str | None = None
    aborted: str | None = None
    capacity: dict[str, Any] | None = None
    """``capacity`` (req/s or streams), ``upper``, ``over``, ``stop_reason``,
    ``precision_reached``, ``probes``."""
    curve: list[dict[str, Any]] = field(default_factory=list)
    """Points of the latency-throughput curve (the capacity probes, or the ``curve:``
    sweep), by ``x``."""
    output_tokens: int = 0
    """Every output token of the measured phase (a capacity search: all its probes'): what
    the phase's GPU energy is divided by for J/token. Not the curve's, swept after it."""

    def score_inputs(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """What the scorer reads: the stored ``metrics`` (this measurement's, dumped once by
        the caller), plus ``capacity`` when searched."""
        if self.capacity is None:
            return metrics
        return {**metrics, "capacity": self.capacity["capacity"]}


def measure(
    endpoint: str,
    load: LoadSpec,
    plan: MeasurePlan,
    *,
    speedup: float,
    deadline: float,
    on_phase: PhaseCallback,
    on_progress: ProgressCallback,
    abort_if: AbortRule | None,
    on_curve: Callable[[], None] = lambda: None,
) -> Measured:
    """Measure the running deployment at ``endpoint``; raises ``BenchError`` as ``run_load``
    does (warm-up failed, nothing succeeded). ``on_curve`` is called before the sweep."""
    if plan.capacity is None:
        result = run_load(
            endpoint,
            load,
            on_phase=on_phase,
            on_progress=on_progress,
            deadline=deadline,
            abort_if=abort_if,
        )
        out = Measured(
            metrics=rescale_time(result.metrics, speedup),
            warmup_seconds=result.warmup_seconds,
            measure_seconds=result.measure_seconds,
            stop_reason=result.stop_reason,
            aborted=result.aborted,
            output_tokens=result.metrics.output_tokens,
        )
    else:
        out = _capacity(endpoint, load, plan.capacity, speedup, deadline, on_phase, on_progress)
    if plan.curve is not None and out.aborted is None:
        on_curve()
        points = sweep(
            endpoint, load, over=plan.curve.over, points=plan.curve.points, deadline=deadline
        )
        out.curve = sorted(
            (p.summary(over=plan.curve.over, factor=speedup) for p in points),
            key=lambda point: point["x"],
        )
    return out


def _capacity(
    endpoint: str,
    load: LoadSpec,
    search: CapacitySearch,
    speedup: float,
    deadline: float,
    on_phase: PhaseCallback,
    on_progress: ProgressCallback,
) -> Measured:
    found, warmup = find_capacity(
        endpoint, load, search, on_phase=on_phase, on_progress=on_progress, deadline=deadline
    )
    if not found.probes:
        raise BenchError(f"capacity search ran no probe: {found.stop_reason}")
    over = search.over
    scale = speedup if over == "rate" else 1.0
    at = found.metrics if found.metrics is not None else found.probes[-1].metrics
    points = [p.summary(over=over, factor=speedup) for p in found.probes]
    return Measured(
        metrics=rescale_time(at, speedup),
        warmup_seconds=warmup,
        measure_seconds=sum(p.seconds for p in found.probes),
        stop_reason=f"capacity search: {found.stop_reason}",
        capacity={
            "over": over,
            "capacity": found.capacity / scale,
            "upper": None if found.upper is None else found.upper / scale,
            "stop_reason": found.stop_reason,
            "precision_reached": found.precision_reached,
            "probes": len(found.probes),
        },
        curve=sorted(points, key=lambda point: point["x"]),
        output_tokens=sum(p.metrics.output_tokens for p in found.probes),
    )
