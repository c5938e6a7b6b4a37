"""Benchmark figures from raw records: a pure function, DOMAIN.md §3 definitions exactly.

Only successful requests count. Output length comes from the server's ``usage`` (one chunk
may carry several tokens under speculative decoding); a request without usage falls back
to its chunk count and is counted in ``usage_missing``. Percentiles use numpy's default
(linear) method, like sglang ``bench_serving`` and ``vllm bench serve``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import chain

import numpy as np
from pydantic import BaseModel, ConfigDict

from autotune.loadgen.records import RequestRecord
from autotune.loadgen.spec import SLO, LoadSpec

CLIENT_BOUND_CPU = 0.9
"""Event-loop CPU share above which the client is reported as the possible bottleneck."""
CLIENT_BOUND_LAG_S = 0.002
CLIENT_BOUND_LAG_GAPS = 0.25
"""Open loop: a p99 send lag above max(2 ms, a quarter of the mean arrival gap) means the
client could not keep the schedule."""
STEAL_NOTED = 0.005
"""Stolen CPU share from which a client-bound result names the hypervisor too."""
RSE_BINS = 10
"""Time bins of the batch-means estimate of the throughput's relative standard error."""
_MAX_ERROR_KINDS = 10
_ERROR_CHARS = 160


def percentile_key(p: float) -> str:
    """``99`` -> ``"p99"``, ``99.9`` -> ``"p99.9"``."""
    return f"p{p:g}"


class LatencyStats(BaseModel):
    """Mean and percentiles in milliseconds; ``None`` when there was no sample.

    ``p50``/``p90``/``p99`` are always present (the stored schema); other requested
    percentiles appear as extra keys (``p95``, ``p99.9``).
    """

    model_config = ConfigDict(extra="allow")

    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None

    def percentile(self, p: float) -> float | None:
        """The value for percentile ``p`` if it was computed."""
        value = getattr(self, percentile_key(p), None)
        return None if value is None else float(value)


class Metrics(BaseModel):
    """Everything a trial is scored on. Throughputs per second of ``duration_s``."""

    model_config = ConfigDict(extra="forbid")

    output_throughput: float
    """Sum of completion tokens (from usage) / duration, tok/s."""
    total_throughput: float
    """(prompt + completion tokens) / duration, tok/s."""
    request_throughput: float
    """Successful requests / duration, req/s."""
    ttft_ms: LatencyStats
    tpot_ms: LatencyStats
    itl_ms: LatencyStats
    e2e_ms: LatencyStats
    error_rate: float
    goodput: float
    """Successful requests meeting every set SLO / duration, req/s (= request_throughput
    when no SLO is set)."""
    completed: int
    failed: int
    duration_s: float
    input_tokens: int
    output_tokens: int
    slo_met: int
    """Successful requests meeting every set SLO."""
    usage_missing: int
    """Successful requests whose tokens were counted from chunks (no usage from server)."""
    output_throughput_rse: float | None
    """Relative standard error of output throughput (batch means over time bins); a rough
    noise estimate, ``None`` when too few samples."""
    errors: dict[str, int]
    """Most frequent error messages (truncated) and their counts."""
    arrival_rate: float | None = None
    """Open loop: requests/s the schedule actually offered, (n - 1) / (last due - first due)
    over every dispatched request (the nominal rate's Poisson draw)."""
    send_lag_ms: LatencyStats | None = None
    """Open loop: how late requests left the client against their schedule (wall clock,
    never rescaled: a property of the client, not of the modeled hardware)."""
    client_cpu_share: float | None = None
    """CPU time of the load generator's event-loop thread / measure time (1.0 = one core
    saturated)."""
    cpu_steal_share: float | None = None
    """Share of this machine's CPU time the hypervisor took during the measure phase
    (``/proc/stat`` steal; ``None`` where unknown): a virtual machine's stalls that no
    setting inside it removes."""
    client_bound: str | None = None
    """Why the client, not the server, may have limited these figures; ``None`` if not."""


def latency_stats(values_s: Iterable[float], percentiles: Sequence[float]) -> LatencyStats:
    """Stats in ms of durations given in seconds."""
    arr = np.fromiter(values_s, dtype=float) * 1000.0
    if arr.size == 0:
        return LatencyStats()
    ps = sorted({50.0, 90.0, 99.0, *map(float, percentiles)})
    values = np.percentile(arr, ps)
    fields: dict[str, float] = {"mean": float(np.mean(arr))}
    fields.update({percentile_key(p): float(v) for p, v in zip(ps, values, strict=True)})
    return LatencyStats(**fields)


def _itl_seconds(ok: Sequence[RequestRecord]) -> np.ndarray:
    """Gaps between consecutive text chunks within each request, flattened."""
    lens = np.fromiter((len(r.chunk_times) for r in ok), dtype=np.int64, count=len(ok))
    total = int(lens.sum())
    if total < 2:
        return np.empty(0)
    times = np.fromiter(chain.from_iterable(r.chunk_times for r in ok), dtype=float, count=total)
    gaps = np.diff(times)
    starts = np.cumsum(lens) - lens
    cross = starts[(lens > 0) & (starts > 0)] - 1  # gap from one request into the next
    keep = np.ones(gaps.size, dtype=bool)
    keep[cross] = False
    return gaps[keep]


def _throughput_rse(ok: Sequence[RequestRecord], start: float, duration: float) -> float | None:
    """Batch-means RSE: tokens binned by chunk arrival time (usage tokens spread evenly)."""
    if duration <= 0 or not ok:
        return None
    times: list[float] = []
    weights: list[float] = []
    for r in ok:
        n = r.output_tokens
        if r.chunk_times:
            times.extend(r.chunk_times)
            weights.extend([n / len(r.chunk_times)] * len(r.chunk_times))
        else:
            times.append(r.end_time)
            weights.append(float(n))
    if len(times) < 2 * RSE_BINS:
        return None
    counts, _ = np.histogram(
        np.asarray(times), bins=RSE_BINS, range=(start, start + duration), weights=weights
    )
    mean = float(np.mean(counts))
    if mean <= 0:
        return None
    return float(np.std(counts, ddof=1) / math.sqrt(RSE_BINS) / mean)


def _meets(r: RequestRecord, slo: SLO) -> bool:
    if slo.ttft_ms is not None:
        ttft = r.ttft_s
        if ttft is None or ttft * 1000.0 > slo.ttft_ms:
            return False
    if slo.tpot_ms is not None:
        tpot = r.tpot_s  # one-token outputs have no TPOT and cannot violate it
        if tpot is not None and tpot * 1000.0 > slo.tpot_ms:
            return False
    return slo.e2e_ms is None or r.latency_s * 1000.0 <= slo.e2e_ms


def compute_metrics(
    records: Sequence[RequestRecord],
    *,
    duration_s: float | None = None,
    slo: SLO | None = None,
    percentiles: Sequence[float] = (50, 90, 99),
) -> Metrics:
    """Metrics of a measured set of records.

    ``duration_s`` is the benchmark duration (first dispatch to last completion); ``None``
    derives it from the records themselves. ``slo.percentile`` is always computed too.
    """
    slo = slo or SLO()
    ps = [*percentiles, slo.percentile]
    ok = [r for r in records if r.ok]
    failed = len(records) - len(ok)
    start = min((r.send_time for r in records), default=0.0)
    if duration_s is None:
        duration_s = max((r.end_time for r in records), default=0.0) - start
    duration = max(duration_s, 0.0)

    def per_second(x: float) -> float:
        return x / duration if duration > 0 else 0.0

    output_tokens = sum(r.output_tokens for r in ok)
    input_tokens = sum(r.prompt_tokens or 0 for r in ok)
    met = sum(1 for r in ok if _meets(r, slo))
    errors = Counter((r.error or "")[:_ERROR_CHARS] for r in records if not r.ok)
    tpots = (r.tpot_s for r in ok)
    return Metrics(
        output_throughput=per_second(output_tokens),
        total_throughput=per_second(output_tokens + input_tokens),
        request_throughput=per_second(len(ok)),
        ttft_ms=latency_stats((t for r in ok if (t := r.ttft_s) is not None), ps),
        tpot_ms=latency_stats((t for t in tpots if t is not None), ps),
        itl_ms=latency_stats(_itl_seconds(ok), ps),
        e2e_ms=latency_stats((r.latency_s for r in ok), ps),
        error_rate=failed / len(records) if records else 0.0,
        goodput=per_second(met),
        completed=len(ok),
        failed=failed,
        duration_s=duration,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        slo_met=met,
        usage_missing=sum(1 for r in ok if r.usage_missing),
        output_throughput_rse=_throughput_rse(ok, start, duration),
        errors=dict(errors.most_common(_MAX_ERROR_KINDS)),
        arrival_rate=_arrival_rate(records),
        send_lag_ms=_send_lag(records, ps),
    )


def _arrival_rate(records: Sequence[RequestRecord]) -> float | None:
    due = [r.due_time for r in records if r.due_time is not None]
    if len(due) < 2 or max(due) <= min(due):
        return None
    return (len(due) - 1) / (max(due) - min(due))


def _send_lag(
    records: Sequence[RequestRecord], percentiles: Sequence[float]
) -> LatencyStats | None:
    lags = [lag for r in records if (lag := r.send_lag_s) is not None]
    return latency_stats(lags, percentiles) if lags else None


def with_client_load(
    metrics: Metrics,
    spec: LoadSpec,
    *,
    cpu_share: float | None,
    steal_share: float | None = None,
) -> Metrics:
    """``metrics`` with the client's CPU share and, when the client may have been the
    bottleneck, the reason (the figures then say less about the server), with the CPU time
    the hypervisor took meanwhile when it took some (``steal_share``)."""
    reasons = []
    if cpu_share is not None and cpu_share >= CLIENT_BOUND_CPU:
        reasons.append(
            f"the load generator's event loop was busy {cpu_share:.0%} of the measure phase"
        )
    lag = metrics.send_lag_ms
    if lag is not None and lag.p99 is not None and spec.request_rate is not None:
        limit_s = max(CLIENT_BOUND_LAG_S, CLIENT_BOUND_LAG_GAPS / spec.request_rate)
        if lag.p99 > limit_s * 1000.0:
            reasons.append(
                f"p99 send lag {lag.p99:.1f} ms > {limit_s * 1000:.1f} ms: the client did "
                f"not keep the arrival schedule of {spec.request_rate:g} req/s"
            )
    if reasons and steal_share is not None and steal_share >= STEAL_NOTED:
        reasons.append(
            f"the hypervisor took {steal_share:.1%} of this machine's CPU time meanwhile "
            "(steal: stalls no setting inside the machine removes)"
        )
    return metrics.model_copy(
        update={
            "client_cpu_share": cpu_share,
            "cpu_steal_share": steal_share,
            "client_bound": "; ".join(reasons) or None,
        }
    )


def slo_margins(metrics: Metrics, slo: SLO) -> dict[str, float]:
    """Measured percentile minus limit per set SLO (> 0 = violated), keyed like
    ``slo_tpot_p99_ms``; a latency without samples counts as violated (``inf``)."""
    key = percentile_key(slo.percentile)
    out: dict[str, float] = {}
    for name, limit in slo.limits().items():
        stats: LatencyStats = getattr(metrics, name)
        measured = stats.percentile(slo.percentile)
        out[f"slo_{name.removesuffix('_ms')}_{key}_ms"] = (
            math.inf if measured is None else measured - limit
        )
    return out


def rescale_time(metrics: Metrics, factor: float) -> Metrics:
    """The same measurement on a clock running ``factor`` times slower.

    Used for a simulated deployment that runs ``factor`` times faster than the hardware it
    models: durations and latencies are multiplied by ``factor``, rates divided by it. Counts,
    error rate and the relative standard error do not depend on the clock.
    """
    if factor == 1.0:
        return metrics

    def stats(s: LatencyStats) -> LatencyStats:
        data = s.model_dump()
        return LatencyStats(**{k: None if v is None else v * factor for k, v in data.items()})

    return metrics.model_copy(
        update={
            "output_throughput": metrics.output_throughput / factor,
            "total_throughput": metrics.total_throughput / factor,
            "request_throughput": metrics.request_throughput / factor,
            "arrival_rate": None if metrics.arrival_rate is None else metrics.arrival_rate / factor,
            "goodput": metrics.goodput / factor,
            "duration_s": metrics.duration_s * factor,
            "ttft_ms": stats(metrics.ttft_ms),
            "tpot_ms": stats(metrics.tpot_ms),
            "itl_ms": stats(metrics.itl_ms),
            "e2e_ms": stats(metrics.e2e_ms),
        }
    )
