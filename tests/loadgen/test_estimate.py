"""The live throughput estimate: bookkeeping, and 95% CI coverage on simulated closed loops."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from autotune.loadgen.estimate import (
    BIN_S,
    CYCLE_BATCHES,
    ThroughputTracker,
    batch_means,
    t975,
)
from autotune.loadgen.records import RequestRecord


def _closed_loop(
    seed: int,
    *,
    streams: int,
    tokens: int,
    horizon_s: float,
    step_s: float,
    step_jitter: float,
    prefill_s: float,
    accept: tuple[float, ...] = (),
) -> tuple[np.ndarray, float]:
    """Tokens per BIN_S bin of a simulated closed loop, and its mean request latency.

    Lockstep decode (every running stream gets its tokens each step, step times jittered),
    a FIFO prefill queue between a stream's requests (the first token comes with prefill),
    all streams starting together at 0 (the start-up ramp), speculative extra tokens
    accepted with the probabilities in ``accept``.
    """
    rng = random.Random(seed)
    bins = np.zeros(int(horizon_s / BIN_S) + 2)

    def add(t: float, k: int) -> None:
        if t < horizon_s:
            bins[int(t / BIN_S)] += k

    free = 0.0
    queue: list[tuple[float, int]] = []
    started = [0.0] * streams
    for s in range(streams):
        free += prefill_s * (1 + rng.uniform(-0.5, 0.5))
        queue.append((free, s))
        add(free, 1)
    running: dict[int, int] = {}
    t, lat_sum, lat_n = 0.0, 0.0, 0
    while t < horizon_s:
        while queue and queue[0][0] <= t:
            running[queue.pop(0)[1]] = tokens - 1
        if not running:
            t = queue[0][0]
            continue
        t += step_s * (1 + rng.uniform(-step_jitter, step_jitter))
        for s in list(running):
            k = 1
            for a in accept:
                if rng.random() >= a:
                    break
                k += 1
            k = min(k, running[s])
            running[s] -= k
            add(t, k)
            if not running[s]:
                del running[s]
                lat_sum, lat_n = lat_sum + t - started[s], lat_n + 1
                started[s] = t
                free = max(free, t) + prefill_s * (1 + rng.uniform(-0.5, 0.5))
                queue.append((free, s))
                add(free, 1)
        queue.sort()
    return bins[: int(horizon_s / BIN_S)], lat_sum / max(lat_n, 1)


def _truth(**kw: object) -> tuple[float, float]:
    """Long-run rate (start-up excluded) and cycle of one very long run."""
    bins, cycle = _closed_loop(10_000, **kw)  # type: ignore[arg-type]
    skip = int(10 * cycle / BIN_S)
    return float(bins[skip:].sum() / ((bins.size - skip) * BIN_S)), cycle


def _estimate(bins: np.ndarray, latency_s: float) -> tuple[float, float | None]:
    """What ThroughputTracker.estimate does with a window's bins and mean latency."""
    cycle = math.ceil(latency_s / BIN_S)
    return batch_means(
        bins,
        bin_s=BIN_S,
        min_batch_bins=math.ceil(cycle * CYCLE_BATCHES),
        skip_bins=cycle,
    )


NOISY: dict[str, Any] = {
    "streams": 4,
    "tokens": 32,
    "step_s": 0.001,
    "step_jitter": 0.9,
    "prefill_s": 0.002,
}
NOISY_SPEC: dict[str, Any] = {**NOISY, "accept": (0.7, 0.5)}


def test_t_quantiles() -> None:
    assert t975(1) == pytest.approx(12.706) and t975(9) == pytest.approx(2.262)
    assert 1.96 < t975(200) < 1.98


def test_batch_means_needs_enough_batches_and_widens_by_the_ramp() -> None:
    rate, rel = batch_means([10.0] * 40, bin_s=0.02, min_batch_bins=6)
    assert rate == pytest.approx(500.0) and rel is None  # 6 batches of 6 bins < MIN_BATCHES
    rate, rel = batch_means([10.0, 12.0] * 30, bin_s=0.02, min_batch_bins=6)
    assert rate == pytest.approx(550.0) and rel == pytest.approx(0.0)
    # A ramp of 4 empty bins, skipped: the steady rate is exact, the width is the deficit.
    rate, rel = batch_means([0.0] * 4 + [10.0] * 60, bin_s=0.02, min_batch_bins=3, skip_bins=4)
    assert rate == pytest.approx(500.0)
    assert rel == pytest.approx((500.0 - 600 / (64 * 0.02)) / 500.0)
    assert batch_means([], bin_s=0.02, min_batch_bins=1) == (0.0, None)
    assert batch_means([5.0] * 3, bin_s=0.02, min_batch_bins=1, skip_bins=3) == (
        pytest.approx(250.0),
        None,
    )


def test_coverage_of_a_fixed_window() -> None:
    """95% CIs of independent noisy closed loops cover the long-run rate ~95% of the time."""
    truth, cycle = _truth(horizon_s=60.0, **NOISY_SPEC)
    covered = n = 0
    for seed in range(300):
        bins, lat = _closed_loop(seed, horizon_s=20 * cycle, **NOISY_SPEC)
        rate, rel = _estimate(bins, lat)
        assert rel is not None
        n += 1
        covered += abs(rate - truth) <= rel * rate
    assert 0.93 <= covered / n <= 0.995, covered / n


def test_coverage_with_a_start_up_ramp_and_lockstep_rounds() -> None:
    """16 streams restarting together, little noise: the ramp is the error, and it is covered."""
    kw: dict[str, Any] = {
        "streams": 16,
        "tokens": 64,
        "step_s": 0.0015,
        "step_jitter": 0.02,
        "prefill_s": 0.004,
    }
    truth, cycle = _truth(horizon_s=40.0, **kw)
    for seed in range(20):
        bins, lat = _closed_loop(seed, horizon_s=8 * cycle, **kw)
        rate, rel = _estimate(bins, lat)
        assert rel is not None and rel < 0.08
        whole = bins.sum() / (bins.size * BIN_S)
        assert whole < rate < truth  # the ramp, skipped, still lowers the rate a little...
        assert abs(rate - truth) <= rel * rate  # ...and the interval covers the truth


def test_coverage_when_stopping_at_a_target_width() -> None:
    """Stopping the first time the width <= target still covers the truth >= 90% of runs."""
    truth, cycle = _truth(horizon_s=60.0, **NOISY_SPEC)
    covered = n = 0
    for seed in range(100):
        bins, lat = _closed_loop(seed, horizon_s=150 * cycle, **NOISY_SPEC)
        for k in range(10, bins.size, 8):
            rate, rel = _estimate(bins[:k], lat)
            if rel is not None and rel <= 0.08:
                n += 1
                covered += abs(rate - truth) <= rel * rate
                break
    assert n >= 95 and covered / n >= 0.9, (n, covered / n)


def _record(i: int, times: list[float], tokens: int, ok: bool = True) -> RequestRecord:
    return RequestRecord(
        index=i,
        send_time=times[0] - 0.01,
        end_time=times[-1],
        chunk_times=times,
        completion_tokens=tokens,
        error=None if ok else "boom",
    )


def test_tracker_counts_usage_tokens_and_scales_in_flight_chunks() -> None:
    tr = ThroughputTracker(100.0)
    # A finished request: 5 chunks carrying 10 tokens (speculative decoding), 0.0-0.1 s.
    times = [100.0 + 0.02 * k + 0.001 for k in range(5)]
    for t in times:
        tr.chunks(t, 1)
    tr.finish(_record(0, times, 10))
    # One still in flight: 5 chunks at 0.1-0.2 s; counted at 2 tokens each (ratio 10/5).
    for k in range(5):
        tr.chunks(100.1 + 0.02 * k + 0.001, 1)
    # A failed request's chunks vanish once it finishes.
    failed = [100.0 + 0.04 * k + 0.002 for k in range(5)]
    for t in failed:
        tr.chunks(t, 1)
    tr.finish(_record(1, failed, 3, ok=False))
    est = tr.estimate(100.2 + 1e-9)
    assert est.completed == 1
    assert est.output_throughput == pytest.approx(20 / 0.2)
    assert est.rel_half_width is None  # 10 bins, one request latency each: too few batches
    assert est.upper is None and est.lower is None


def test_tracker_interval_on_a_steady_stream() -> None:
    tr = ThroughputTracker(0.0)
    t, i = 0.0, 0
    while t < 3.0:  # 4 requests of 10 chunks, one every 5 ms: 800 tok/s
        times = [t + 0.005 * k for k in range(1, 11)]
        for tt in times:
            tr.chunks(tt, 4)
        for _ in range(4):
            tr.finish(_record(i, times, 10))
            i += 1
        t = times[-1]
    est = tr.estimate(3.0)
    assert est.output_throughput == pytest.approx(800, rel=0.02)
    assert est.rel_half_width is not None and est.rel_half_width < 0.02
    assert est.lower is not None and est.upper is not None
    assert est.lower < est.output_throughput < est.upper
