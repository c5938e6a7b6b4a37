"""When each request of an open loop is due: Poisson or gamma inter-arrival times.

Definitions follow SGLang ``bench_serving`` and ``vllm bench serve``: at ``request_rate``
requests/s with ``burstiness`` b, the gaps between arrivals are Gamma(shape=b,
scale=1/(rate*b)) distributed, so their mean is 1/rate whatever b is; b = 1 is a Poisson
process, b < 1 burstier (clumps and lulls), b > 1 more regular. The first request is due at
once. The schedule is a pure function of (rate, burstiness, seed), so two runs with equal
settings offer the server the same arrival pattern.
"""

from __future__ import annotations

import math

import numpy as np

_BLOCK = 1024
"""Gaps are drawn in blocks of this many: an open-ended run never holds them all."""


def _check(rate: float, burstiness: float) -> None:
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate must be a positive finite number of requests/s, not {rate}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise ValueError(f"burstiness must be a positive finite number, not {burstiness}")


class ArrivalSchedule:
    """Arrival offsets (seconds after the start) of requests 0, 1, 2, ..., read in order."""

    __slots__ = ("rate", "burstiness", "_rng", "_block", "_first", "_next_start")

    def __init__(self, *, rate: float, burstiness: float = 1.0, seed: int = 0) -> None:
        _check(rate, burstiness)
        self.rate = float(rate)
        self.burstiness = float(burstiness)
        # A stream of its own (the prompts use ``seed`` alone): equal seeds give equal
        # prompts whether the load is open or closed.
        self._rng = np.random.default_rng([seed, 0x0A11])
        self._block = np.zeros(0)
        self._first = 0
        self._next_start = 0.0

    def _draw(self) -> None:
        b = self.burstiness
        gaps = self._rng.gamma(shape=b, scale=1.0 / (self.rate * b), size=_BLOCK)
        ends = self._next_start + np.cumsum(gaps)
        self._first += self._block.size
        self._block = np.concatenate(([self._next_start], ends[:-1]))
        self._next_start = float(ends[-1])

    def offset(self, index: int) -> float:
        """Seconds after the start at which request ``index`` is due."""
        if index < self._first:
            raise IndexError(f"request {index} was already read (read them in order)")
        while index >= self._first + self._block.size:
            self._draw()
        return float(self._block[index - self._first])


def arrival_offsets(
    count: int, *, rate: float, burstiness: float = 1.0, seed: int = 0
) -> np.ndarray:
    """The first ``count`` arrival offsets of :class:`ArrivalSchedule` (for tests, plots)."""
    schedule = ArrivalSchedule(rate=rate, burstiness=burstiness, seed=seed)
    return np.array([schedule.offset(i) for i in range(count)])
