"""A Prometheus text exposition of the metrics SGLang 0.5.23's ``/metrics`` serves (§3).

Names, help texts, label names and buckets are those of
``python/sglang/srt/observability/metrics_collector.py``: the scheduler's gauges carry
``model_name``, ``engine_type`` (prefill / decode / unified), ``tp_rank``, ``pp_rank`` and
``moe_ep_rank``; the tokenizer's counters and histograms carry ``model_name`` and
``engine_type``, plus ``is_streaming`` on the per-request ones. Lines are written the way
``prometheus_client`` writes them: labels sorted by name, values as floats (``3.0``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence

# SGLang's bucket boundaries (TokenizerMetricsCollector defaults)
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
E2E_BUCKETS = (*TTFT_BUCKETS, 800.0)
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

Labels = Mapping[str, str]


def engine_type(disaggregation_mode: str) -> str:
    """``DisaggregationMode.to_engine_type``: prefill, decode, else unified."""
    return disaggregation_mode if disaggregation_mode in ("prefill", "decode") else "unified"


def scheduler_labels(model_name: str, disaggregation_mode: str) -> dict[str, str]:
    """The scheduler collector's labels of the stats-logging rank (TP rank 0, no DP)."""
    return {
        "model_name": model_name,
        "engine_type": engine_type(disaggregation_mode),
        "tp_rank": "0",
        "pp_rank": "0",
        "moe_ep_rank": "0",
    }


def tokenizer_labels(model_name: str, disaggregation_mode: str) -> dict[str, str]:
    """``tokenizer_metric_labels()``: model name and engine type."""
    return {"model_name": model_name, "engine_type": engine_type(disaggregation_mode)}


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def label_text(labels: Labels) -> str:
    """``{a="1",b="2"}`` with names sorted, as prometheus_client writes them."""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items())) + "}"


def number(value: float) -> str:
    """prometheus_client's ``floatToGoString``: ``3.0``, ``+Inf``, ``NaN``."""
    v = float(value)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


class Histogram:
    """Cumulative-bucket histogram, one series per value of an optional extra label.

    ``observe(v, n, key)`` records ``n`` equal observations in the series ``key`` (the
    value of ``extra_label``, e.g. ``is_streaming``; ignored without one).
    """

    def __init__(
        self, name: str, doc: str, buckets: Sequence[float], *, extra_label: str | None = None
    ) -> None:
        self.name, self.doc = name, doc
        self.buckets = tuple(buckets)
        self.extra_label = extra_label
        self._series: dict[str, tuple[list[int], list[float]]] = {}

    def observe(self, value: float, n: int = 1, key: str = "") -> None:
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = ([0] * (len(self.buckets) + 1), [0.0, 0.0])
        counts, sums = series
        counts[bisect.bisect_left(self.buckets, value)] += n
        sums[0] += value * n
        sums[1] += n

    @property
    def n(self) -> int:
        return int(sum(s[1][1] for s in self._series.values()))

    def render(self, labels: Labels) -> list[str]:
        out = [f"# HELP {self.name} {self.doc}", f"# TYPE {self.name} histogram"]
        for key in sorted(self._series):
            counts, (total, n) = self._series[key]
            base = dict(labels)
            if self.extra_label is not None:
                base[self.extra_label] = key
            acc = 0
            for le, c in zip(self.buckets, counts, strict=False):
                acc += c
                out.append(
                    f"{self.name}_bucket{label_text({**base, 'le': number(le)})} {number(acc)}"
                )
            out.append(f"{self.name}_bucket{label_text({**base, 'le': '+Inf'})} {number(n)}")
            out.append(f"{self.name}_count{label_text(base)} {number(n)}")
            out.append(f"{self.name}_sum{label_text(base)} {number(total)}")
        return out


def render_metrics(
    *,
    scheduler: Labels,
    tokenizer: Labels,
    gauges: Mapping[str, tuple[str, float]],
    counters: Mapping[str, tuple[str, Mapping[str, float]]],
    histograms: Sequence[Histogram],
    counter_label: str = "is_streaming",
    counter_labels: Mapping[str, str] | None = None,
) -> str:
    """Prometheus text format.

    ``gauges``: name -> (help, value), labelled ``scheduler``; ``counters``: name -> (help,
    {``counter_label`` value: count}), labelled ``tokenizer`` plus ``counter_label`` (a
    counter with no series yet has only its HELP and TYPE lines, like prometheus_client);
    ``counter_labels`` names another extra label for some counters (name -> label, e.g.
    ``cache_source``); ``histograms`` are labelled ``tokenizer`` (plus their own extra label).
    """
    sched = label_text(scheduler)
    lines: list[str] = []
    for name, (doc, value) in gauges.items():
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} gauge", f"{name}{sched} {number(value)}"]
    for name, (doc, series) in counters.items():
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} counter"]
        extra = (counter_labels or {}).get(name, counter_label)
        for key in sorted(series):
            labels = label_text({**tokenizer, extra: key})
            lines.append(f"{name}{labels} {number(series[key])}")
    for h in histograms:
        lines += h.render(tokenizer)
    return "\n".join(lines) + "\n"
