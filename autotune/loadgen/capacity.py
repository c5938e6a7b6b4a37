"""Capacity: the highest request rate (or concurrency) at which every SLO holds.

Found inside one trial on the running server, without a restart: a geometric ramp from
``start`` until a probe breaks an SLO (or ``limit`` is reached), then bisection of the
bracket (geometric midpoints) until its width is within ``precision`` or the time budget
is spent. A probe is one measure phase of the study's load at that rate; it passes when
the ``percentile`` of TTFT, TPOT and E2E are within their set limits, the error rate is at
most ``max_error_rate``, and (open loop) the server kept up: it completed requests at least
``min_served`` x as fast as they arrived (:func:`served_share`). Without that, a server
that falls behind could pass a TPOT-only SLO while its queue grows; a latency SLO (TTFT or
E2E) is what pins capacity down, hence the check's tolerant default of 0.9.

This is what vLLM's ``benchmarks/auto_tune`` and SGLang's ``auto_benchmark`` do across
restarts, per configuration; here it is one trial's measurement, so the sampler sees
capacity as the objective. Probes are independent of each other: each sends the prompts
after the previous probe's (a prefix cache never sees a request twice), and a probe that
overloaded the server ends with its in-flight requests finished or cancelled before the
next starts.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from time import monotonic, perf_counter
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from autotune.errors import BenchError
from autotune.loadgen.client import BenchResult, LoadSession, PhaseCallback, ProgressCallback
from autotune.loadgen.metrics import Metrics, compute_metrics, rescale_time, slo_margins
from autotune.loadgen.records import RequestRecord
from autotune.loadgen.spec import LoadSpec

Over = Literal["rate", "concurrency"]


class CapacitySearch(BaseModel):
    """How to search (a study's ``capacity:`` section). Rates in requests/s."""

    model_config = ConfigDict(extra="forbid")

    over: Over = "rate"
    """``rate``: open-loop request rate (the load's ``burstiness``, ``max_concurrency``
    apply); ``concurrency``: closed-loop streams."""
    start: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    """First probe; the ramp multiplies it by ``growth`` (and divides, if it fails)."""
    limit: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Highest rate or concurrency probed; capacity at or above it reads as ``limit``."""
    floor: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Lowest probed when ``start`` already fails (default ``start / 8``: at a low load
    the latencies are as good as they get, so a configuration that still breaks an SLO
    there has no capacity worth a finer search)."""
    growth: float = Field(default=2.0, gt=1, le=16, allow_inf_nan=False)
    precision: float = Field(default=0.05, gt=0, le=1, allow_inf_nan=False)
    """Stop bisecting when the bracket's upper end is within this share of the lower."""
    budget_s: float = Field(default=300.0, gt=0, allow_inf_nan=False)
    """Wall time for all probes (no probe starts that would not fit, judged by the longest
    so far)."""
    max_error_rate: float = Field(default=0.0, ge=0, le=1)
    min_served: float = Field(default=0.9, gt=0, le=1)
    confirm: int = Field(default=1, ge=0, le=3)
    """A failing probe is measured again up to this many times (budget permitting); its load
    fails only when every measurement fails. One p99 is a few requests: a pause of the
    server or of the client (descheduled on shared cores) breaks it once, and a search that
    takes that first failure as its bound reports a capacity several times too low (the real
    vLLM's baseline: 76.1, 11.3 and 76.1 req/s from three starts). The price: a load that
    fails each measurement with probability q now fails with q**(1 + confirm), so the bound
    can sit one bisection step higher where the SLO is met half the time."""


class SweepSpec(BaseModel):
    """A latency-throughput curve to record (a study's ``curve:`` section)."""

    model_config = ConfigDict(extra="forbid")

    over: Over = "concurrency"
    points: list[float] = Field(min_length=1, max_length=64)
    """Rates (req/s) or concurrencies, measured in this order on the running server."""

    @model_validator(mode="after")
    def _positive(self) -> SweepSpec:
        bad = [p for p in self.points if not (p > 0 and math.isfinite(p))]
        if bad or (self.over == "concurrency" and any(p != int(p) for p in self.points)):
            raise PydanticCustomError(
                "points",
                "curve points must be positive{whole}; got {points}",
                {
                    "whole": " whole numbers (concurrencies)" if self.over == "concurrency" else "",
                    "points": self.points,
                    "field": "points",
                },
            )
        return self


class Probe(BaseModel):
    """One measured load of the search."""

    model_config = ConfigDict(extra="forbid")

    x: float
    """The rate (req/s) or concurrency probed."""
    retry: int = 0
    """0 for a load's first measurement, k for its k-th re-measurement after a failure."""
    ok: bool
    violations: list[str]
    """What broke (``ttft_p99 412 > 300 ms``, ``error rate``, ``served 71% of the rate``)."""
    metrics: Metrics
    seconds: float

    def summary(self, *, over: Over, factor: float = 1.0) -> dict[str, Any]:
        """The point as stored with a trial (compact), on a clock ``factor`` x slower (a
        simulated deployment's modeled hardware, like :func:`rescale_time`)."""
        m = rescale_time(self.metrics, factor)
        return {
            "x": self.x / factor if over == "rate" else self.x,
            "retry": self.retry,
            "ok": self.ok,
            "violations": self.violations,
            "output_throughput": m.output_throughput,
            "request_throughput": m.request_throughput,
            "goodput": m.goodput,
            "arrival_rate": m.arrival_rate,
            "error_rate": m.error_rate,
            "completed": m.completed,
            "send_lag_p99_ms": None if m.send_lag_ms is None else m.send_lag_ms.p99,
            "client_cpu_share": m.client_cpu_share,
            "cpu_steal_share": m.cpu_steal_share,
            "client_bound": m.client_bound,
            **{
                f"{name}_{p}": getattr(getattr(m, f"{name}_ms"), p)
                for name in ("ttft", "tpot", "itl", "e2e")
                for p in ("mean", "p50", "p99")
            },
        }


class CapacityResult(BaseModel):
    """The highest passing load, what was measured there, and every probe."""

    model_config = ConfigDict(extra="forbid")

    over: Over
    capacity: float
    """The highest passing rate / concurrency; 0 when none passed."""
    upper: float | None
    """The lowest failing one above it (``None``: the limit passed, or no probe failed)."""
    metrics: Metrics | None
    """The probe at ``capacity`` (``None`` when none passed)."""
    probes: list[Probe]
    stop_reason: str
    precision_reached: bool


def served_share(records: Sequence[RequestRecord]) -> float | None:
    """Completions per second over arrivals per second, each over its own span: (n - 1) /
    (last end - first end) against (n - 1) / (last due - first due). A server that keeps up
    finishes requests as they come (the spans match, whatever the latency); one that falls
    behind completes them at its own pace. Not completions over the whole run, which the
    last request's latency dilutes (by a tenth for a 3 s latency in a 30 s probe)."""
    due = [r.due_time for r in records if r.due_time is not None]
    ends = [r.end_time for r in records if r.ok]
    if len(due) < 3 or len(ends) < 3:
        return None
    arrivals = (len(due) - 1) / max(max(due) - min(due), 1e-9)
    completions = (len(ends) - 1) / max(max(ends) - min(ends), 1e-9)
    return completions / arrivals


def probe_violations(
    metrics: Metrics,
    spec: LoadSpec,
    search: CapacitySearch,
    x: float,
    *,
    served: float | None = None,
) -> list[str]:
    """Why a probe at ``x`` fails the SLOs; empty when it passes. Stated as ratios, which
    read the same on the wall clock and on a simulated deployment's modeled one."""
    out = []
    limits = spec.slo.limits()
    for key, margin in slo_margins(metrics, spec.slo).items():
        if margin > 0:
            name = key.removeprefix("slo_").removesuffix("_ms")
            limit = limits[f"{name.split('_')[0]}_ms"]
            measured = "no sample" if math.isinf(margin) else f"{1 + margin / limit:.2f}x"
            out.append(f"{name} {measured} its limit")
    if metrics.error_rate > search.max_error_rate:
        out.append(f"error rate {metrics.error_rate:.1%} > {search.max_error_rate:.1%}")
    if search.over == "rate":
        if served is None:  # too few requests for spans: completions over the run
            served = metrics.request_throughput / (metrics.arrival_rate or x)
        if served < search.min_served:
            out.append(
                f"served {served:.0%} of the offered rate (min_served {search.min_served:.0%})"
            )
    return out


def spec_at(spec: LoadSpec, over: Over, x: float) -> LoadSpec:
    """The load ``spec`` at rate or concurrency ``x`` (the rest unchanged)."""
    if over == "rate":
        return spec.model_copy(update={"request_rate": x})
    return spec.model_copy(update={"concurrency": int(x), "request_rate": None})


class _Search:
    def __init__(
        self,
        session: LoadSession,
        spec: LoadSpec,
        search: CapacitySearch,
        on_probe: Callable[[Probe], None] | None,
        deadline: float | None,
        on_progress: ProgressCallback | None = None,
    ) -> None:
        self.on_progress = on_progress
        self.session = session
        self.spec = spec
        self.search = search
        self.on_probe = on_probe
        self.deadline = deadline
        self.t0 = perf_counter()
        self.probes: list[Probe] = []
        self.lo: float | None = None
        self.hi: float | None = None
        self.stop_reason = ""

    def _round(self, x: float) -> float:
        return float(max(1, round(x))) if self.search.over == "concurrency" else x

    def _fits(self) -> bool:
        longest = max((p.seconds for p in self.probes), default=0.0)
        used = perf_counter() - self.t0
        if self.probes and used + longest > self.search.budget_s:
            self.stop_reason = f"time budget {self.search.budget_s:g} s spent"
            return False
        if self.deadline is not None and monotonic() + longest > self.deadline:
            self.stop_reason = "trial deadline"
            return False
        return True

    async def probe(self, x: float) -> Probe:
        """The verdict on load ``x``: measured, and on failure re-measured up to
        ``confirm`` times while the budget allows; the bracket moves on the verdict."""
        probe = await self.measure(x)
        while not probe.ok and probe.retry < self.search.confirm and self._fits():
            probe = await self.measure(x, retry=probe.retry + 1)
        if probe.ok:
            self.lo = x if self.lo is None else max(self.lo, x)
        else:
            self.hi = x if self.hi is None else min(self.hi, x)
        return probe

    async def measure(self, x: float, *, retry: int = 0) -> Probe:
        """One measurement of load ``x``, recorded (``on_probe``), the bracket untouched."""
        spec = spec_at(self.spec, self.search.over, x)
        t = perf_counter()
        try:
            result: BenchResult | None = await self.session.measure(
                spec, on_progress=self.on_progress
            )
            error = None
        except BenchError as exc:  # nothing succeeded at this load: a failed probe
            result, error = None, str(exc)
        seconds = perf_counter() - t
        if result is None:
            metrics = _empty_metrics(seconds)
            violations = [f"no request succeeded: {error}"]
        else:
            metrics = result.metrics
            served = served_share(result.records)
            violations = probe_violations(metrics, spec, self.search, x, served=served)
        probe = Probe(
            x=x,
            retry=retry,
            ok=not violations,
            violations=violations,
            metrics=metrics,
            seconds=seconds,
        )
        self.probes.append(probe)
        if self.on_probe is not None:
            self.on_probe(probe)
        return probe

    async def run(self) -> CapacityResult:
        s = self.search
        x = self._round(s.start)
        while self._fits():  # ramp up
            if not (await self.probe(x)).ok:
                break
            if s.limit is not None and x >= s.limit:
                self.stop_reason = f"the limit {s.limit:g} passes"
                return self._result(precise=True)
            nxt = self._round(x * s.growth)
            x = min(nxt, s.limit) if s.limit is not None else nxt
        else:
            return self._result(precise=False)
        if self.lo is None:  # the start failed: ramp down
            floor = s.floor if s.floor is not None else s.start / 8
            while self.lo is None and self._fits():
                nxt = self._round(x / s.growth)
                if nxt < floor or nxt == x:
                    self.stop_reason = f"no load down to {floor:g} met the SLOs"
                    return self._result(precise=True)
                x = nxt
                await self.probe(x)
            if self.lo is None:
                return self._result(precise=False)
        adjacent = False
        while self._width_left() and self._fits():  # bisect
            assert self.lo is not None and self.hi is not None
            mid = self._round(math.sqrt(self.lo * self.hi))
            if mid in (self.lo, self.hi):
                adjacent = True  # concurrencies: nothing between them
                break
            await self.probe(mid)
        precise = adjacent or not self._width_left()
        if precise:
            self.stop_reason = (
                "bracket of adjacent concurrencies"
                if adjacent
                else f"bracket within {s.precision:.0%}"
            )
        return self._result(precise=precise)

    def _width_left(self) -> bool:
        if self.lo is None or self.hi is None:
            return False
        return self.hi / self.lo - 1 > self.search.precision

    def _result(self, *, precise: bool) -> CapacityResult:
        at = None
        if self.lo is not None:
            at = next(p.metrics for p in reversed(self.probes) if p.ok and p.x == self.lo)
        upper = self.hi if self.hi is not None and (self.lo is None or self.hi > self.lo) else None
        return CapacityResult(
            over=self.search.over,
            capacity=self.lo or 0.0,
            upper=upper,
            metrics=at,
            probes=self.probes,
            stop_reason=self.stop_reason,
            precision_reached=precise,
        )


def _empty_metrics(seconds: float) -> Metrics:
    return compute_metrics([], duration_s=seconds).model_copy(update={"error_rate": 1.0})


async def afind_capacity(
    url: str,
    spec: LoadSpec,
    search: CapacitySearch,
    *,
    on_phase: PhaseCallback | None = None,
    on_probe: Callable[[Probe], None] | None = None,
    on_progress: ProgressCallback | None = None,
    deadline: float | None = None,
) -> tuple[CapacityResult, float]:
    """Warm up once, then search; the result and the warm-up's seconds. ``on_progress``
    follows each probe's requests like :func:`arun_load`'s.

    Raises :class:`BenchError` when warm-up fails (the server cannot be measured at all);
    a probe at which nothing succeeds is a failed probe, not an error.
    """
    async with _warmed(url, spec, deadline, on_phase) as (session, warmup):
        result = await _Search(session, spec, search, on_probe, deadline, on_progress).run()
    return result, warmup


@asynccontextmanager
async def _warmed(
    url: str, spec: LoadSpec, deadline: float | None, on_phase: PhaseCallback | None
) -> AsyncIterator[tuple[LoadSession, float]]:
    """A session on ``url``, warmed up once (its seconds beside it), in its measure phase."""
    async with LoadSession(url, spec, deadline=deadline) as session:
        warmup = await session.warm_up(on_phase=on_phase)
        if on_phase:
            on_phase("measure")
        yield session, warmup


def find_capacity(
    url: str,
    spec: LoadSpec,
    search: CapacitySearch,
    *,
    on_phase: PhaseCallback | None = None,
    on_probe: Callable[[Probe], None] | None = None,
    on_progress: ProgressCallback | None = None,
    deadline: float | None = None,
) -> tuple[CapacityResult, float]:
    """Synchronous :func:`afind_capacity`."""
    return asyncio.run(
        afind_capacity(
            url,
            spec,
            search,
            on_phase=on_phase,
            on_probe=on_probe,
            on_progress=on_progress,
            deadline=deadline,
        )
    )


async def asweep(
    url: str,
    spec: LoadSpec,
    *,
    over: Over,
    points: Sequence[float],
    max_error_rate: float = 0.0,
    on_phase: PhaseCallback | None = None,
    deadline: float | None = None,
) -> list[Probe]:
    """A latency-throughput curve: ``spec`` measured at each rate or concurrency in turn on
    the running server (one warm-up); each point says whether it met the SLOs."""
    rules = CapacitySearch(over=over, max_error_rate=max_error_rate)
    async with _warmed(url, spec, deadline, on_phase) as (session, _):
        search = _Search(session, spec, rules, None, deadline)
        for x in points:  # a curve's points are measured once each: no verdicts
            await search.measure(search._round(x))
    return search.probes


def sweep(
    url: str,
    spec: LoadSpec,
    *,
    over: Over,
    points: Sequence[float],
    max_error_rate: float = 0.0,
    deadline: float | None = None,
) -> list[Probe]:
    """Synchronous :func:`asweep`."""
    return asyncio.run(
        asweep(
            url, spec, over=over, points=points, max_error_rate=max_error_rate, deadline=deadline
        )
    )
