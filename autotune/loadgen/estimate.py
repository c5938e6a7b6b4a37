"""Live output-throughput estimate of a running closed loop, with a 95% confidence interval.

What is estimated: the steady-state rate at which generated tokens arrive. Tokens are
placed in time by the arrival of the chunk that carried them (like the server's own
counter), in ``BIN_S`` bins of the measure window; in a closed loop of C streams with
equal output lengths, completions come in bursts (rounds), chunk arrivals do not.

Start-up: warm-up drains before the measure phase, so all C streams restart together and
wait for prefill; the first request latency ("cycle") of the window is a ramp, not the
steady state. The rate is taken over the window after that first cycle.

Why batch means, and why batches of a fixed share of a request latency: the tokens of one
request, and of the C requests in flight together, are correlated in time (they share
decode steps; a slow step slows all of them; streams that restarted together stay in phase
for many rounds, so the rate dips every round while they wait for prefill). Per-request or
per-token samples are therefore not independent, and a naive standard error is far too
small. The steady window is cut into ``B`` equal batches (``MIN_BATCHES`` <= B <=
``MAX_BATCHES``, fewer batches of more bins as the run grows: "fixed number of batches"),
each at least ``CYCLE_BATCHES`` mean request latencies long, so that a batch spans a good
part of a closed-loop cycle and batch rates are close to independent (what remains,
periodic dips, inflates the batch variance: conservative). So the first interval needs one
cycle plus ``MIN_BATCHES * CYCLE_BATCHES`` cycles (3 request latencies). The half-width
is Student's ``t(0.975, B - 1) * s / sqrt(B)`` of the batch rates, widened by the ramp's
deficit (the whole window's rate minus the steady rate): the transient does not end
sharply after one cycle, and a figure over the whole window (``Metrics.output_throughput``)
keeps all of it. ``rel_half_width`` is that half-width over the rate.
``tests/loadgen/test_estimate.py`` checks by simulation (lockstep decode with a start-up
ramp and periodic prefill stalls; noisy streams with speculative tokens) that the interval
covers the long-run rate ~95% of the time or more (96% for the noisy streams, 100% for
lockstep ones, where the ramp term dominates and the interval is 2-4x wider than the
actual error), also when a run stops the first time the width falls under a target
(sequential stopping, which lowers coverage a little: 95-97% in those simulations).

Multi-token chunks (speculative decoding): in-flight chunks count as the running
tokens-per-chunk ratio of finished requests until their request finishes; then the exact
usage count replaces them (spread evenly over that request's chunks). Failed requests'
chunks are removed at completion, as the metrics ignore them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autotune.loadgen.records import RequestRecord

BIN_S = 0.02
"""Width of the base time bins that batches are made of."""
MIN_BATCHES = 8
MAX_BATCHES = 20
CYCLE_BATCHES = 0.25
"""A batch spans at least this many mean request latencies (closed-loop cycles)."""
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
)  # fmt: skip
"""Student's t 0.975 quantiles for 1..20 degrees of freedom."""


def t975(dof: int) -> float:
    """Two-sided 95% Student's t quantile (normal beyond the table)."""
    return _T975[dof - 1] if dof <= len(_T975) else 1.96 + 2.4 / dof


@dataclass(frozen=True, slots=True)
class LiveEstimate:
    """The measure phase so far, as seen at one estimate update."""

    elapsed_s: float
    """Measure time so far (from the first measured dispatch)."""
    completed: int
    """Successful measured requests so far."""
    output_throughput: float
    """Output tokens/s in the steady part of the measure window so far (after the first
    request latency; over the whole window while no request has finished)."""
    rel_half_width: float | None
    """95% CI half-width (widened by the start-up deficit) / ``output_throughput``; None
    until there is enough data (one request latency, then ``MIN_BATCHES`` batches of at
    least ``CYCLE_BATCHES`` request latencies)."""

    @property
    def upper(self) -> float | None:
        """Upper 95% confidence bound of the throughput, if known."""
        if self.rel_half_width is None:
            return None
        return self.output_throughput * (1.0 + self.rel_half_width)

    @property
    def lower(self) -> float | None:
        """Lower 95% confidence bound of the throughput, if known."""
        if self.rel_half_width is None:
            return None
        return self.output_throughput * (1.0 - self.rel_half_width)


def batch_means(
    tokens_per_bin: Sequence[float] | np.ndarray,
    *,
    bin_s: float,
    min_batch_bins: int,
    skip_bins: int = 0,
) -> tuple[float, float | None]:
    """``(rate, rel_half_width)`` of a series of per-bin token counts.

    ``rate`` is the steady-state rate: the bins after the first ``skip_bins`` (the
    start-up ramp). The interval cuts those bins into ``B`` equal batches of at least
    ``min_batch_bins`` bins (leftover bins at the end are left out of the interval only)
    and is widened by the ramp's deficit (the whole window's rate minus the steady one), so
    that it also bounds how far the whole-window figure is from the steady state.
    """
    counts = np.asarray(tokens_per_bin, dtype=float)
    n = counts.size
    if n == 0:
        return 0.0, None
    if skip_bins >= n:
        return float(counts.sum()) / (n * bin_s), None
    steady = counts[skip_bins:]
    rate = float(steady.sum()) / (steady.size * bin_s)
    batches = min(MAX_BATCHES, steady.size // max(1, min_batch_bins))
    if batches < MIN_BATCHES or rate <= 0:
        return rate, None
    size = steady.size // batches
    means = steady[: batches * size].reshape(batches, size).sum(axis=1) / (size * bin_s)
    half = t975(batches - 1) * float(means.std(ddof=1)) / math.sqrt(batches)
    ramp = abs(float(counts.sum()) / (n * bin_s) - rate)
    return rate, (half + ramp) / rate


class ThroughputTracker:
    """Token arrivals of one measure phase in ``BIN_S`` bins, updated as chunks arrive.

    ``chunks(now, k)`` is the hot path (one list update per network read); ``finish``
    folds a finished request's exact token count in; ``estimate`` is called a few times a
    second.
    """

    __slots__ = (
        "t0",
        "_inv",
        "_chunks",
        "_done_chunks",
        "_done_tokens",
        "_sum_chunks",
        "_sum_tokens",
        "_latency_sum",
        "completed",
    )

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self._inv = 1.0 / BIN_S
        self._chunks: list[float] = []  # every text chunk, live
        self._done_chunks: list[float] = []  # chunks of finished requests
        self._done_tokens: list[float] = []  # usage tokens of finished successful requests
        self._sum_chunks = 0
        self._sum_tokens = 0
        self._latency_sum = 0.0
        self.completed = 0

    def _index(self, t: float, bins: list[float]) -> int:
        i = int((t - self.t0) * self._inv)
        if i < 0:
            return 0
        if i >= len(bins):
            bins.extend([0.0] * (i + 64 - len(bins)))
        return i

    def chunks(self, now: float, k: int) -> None:
        """``k`` text chunks arrived at ``now``."""
        bins = self._chunks
        i = int((now - self.t0) * self._inv)
        if 0 <= i < len(bins):
            bins[i] += k
        else:
            bins[self._index(now, bins)] += k

    def finish(self, record: RequestRecord) -> None:
        """A measured request finished (ok or not): replace its chunks by its tokens."""
        times = record.chunk_times
        if not times:
            if record.ok and record.output_tokens:
                self._done_tokens[self._index(record.end_time, self._done_tokens)] += (
                    record.output_tokens
                )
        else:
            per = record.output_tokens / len(times) if record.ok else 0.0
            dc, dt = self._done_chunks, self._done_tokens
            for t in times:
                dc[self._index(t, dc)] += 1.0
                dt[self._index(t, dt)] += per
            if record.ok:
                self._sum_chunks += len(times)
        if record.ok:
            self._sum_tokens += record.output_tokens
            self._latency_sum += record.latency_s
            self.completed += 1

    def estimate(self, now: float) -> LiveEstimate:
        elapsed = now - self.t0
        n = int(elapsed * self._inv)
        if n <= 0:
            return LiveEstimate(max(elapsed, 0.0), self.completed, 0.0, None)
        ratio = self._sum_tokens / self._sum_chunks if self._sum_chunks else 1.0
        bins = np.zeros((3, n))
        for row, src in enumerate((self._chunks, self._done_chunks, self._done_tokens)):
            m = min(n, len(src))
            bins[row, :m] = src[:m]
        live = np.maximum(bins[0] - bins[1], 0.0)  # chunks of requests still in flight
        tokens = bins[2] + live * ratio
        if self.completed:
            cycle_bins = max(1, math.ceil(self._latency_sum / self.completed * self._inv))
            rate, rel = batch_means(
                tokens,
                bin_s=BIN_S,
                min_batch_bins=max(1, math.ceil(cycle_bins * CYCLE_BATCHES)),
                skip_bins=cycle_bins,
            )
        else:  # no request latency known yet: no steady state, no interval
            rate, rel = batch_means(tokens, bin_s=BIN_S, min_batch_bins=1, skip_bins=n)
        return LiveEstimate(elapsed, self.completed, rate, rel)
