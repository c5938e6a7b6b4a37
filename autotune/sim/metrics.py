"""A minimal Prometheus text exposition of the metrics SGLang's ``/metrics`` serves (§3)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

# SGLang's bucket boundaries (python/sglang/srt/metrics/collector.py)
TTFT_BUCKETS = (
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1.0,
    2.0,
    4.0,
    6.0,
    8.0,
    10.0,
    20.0,
    40.0,
    60.0,
    80.0,
    100.0,
    200.0,
    400.0,
)
ITL_BUCKETS = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.010,
    0.015,
    0.020,
    0.025,
    0.030,
    0.035,
    0.040,
    0.060,
    0.080,
    0.100,
    0.200,
    0.400,
    0.600,
    0.800,
    1.0,
    2.0,
    4.0,
    6.0,
    8.0,
)


class Histogram:
    """Cumulative-bucket histogram; ``observe(v, n)`` records ``n`` equal observations."""

    def __init__(self, name: str, doc: str, buckets: Sequence[float]) -> None:
        self.name, self.doc = name, doc
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += n
        self.total += value * n
        self.n += n

    def render(self, labels: str) -> list[str]:
        out = [f"# HELP {self.name} {self.doc}", f"# TYPE {self.name} histogram"]
        acc = 0
        for le, c in zip(self.buckets, self.counts, strict=False):
            acc += c
            out.append(f'{self.name}_bucket{{{labels},le="{le}"}} {acc}')
        out.append(f'{self.name}_bucket{{{labels},le="+Inf"}} {self.n}')
        out.append(f"{self.name}_sum{{{labels}}} {self.total}")
        out.append(f"{self.name}_count{{{labels}}} {self.n}")
        return out


def render_metrics(
    *,
    model_name: str,
    gauges: dict[str, tuple[str, float]],
    counters: dict[str, tuple[str, float]],
    histograms: Sequence[Histogram],
) -> str:
    """Prometheus text format, every series labelled with ``model_name``."""
    labels = f'model_name="{model_name}"'
    lines: list[str] = []
    for name, (doc, value) in gauges.items():
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} gauge", f"{name}{{{labels}}} {value}"]
    for name, (doc, value) in counters.items():
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} counter", f"{name}{{{labels}}} {value}"]
    for h in histograms:
        lines += h.render(labels)
    return "\n".join(lines) + "\n"
