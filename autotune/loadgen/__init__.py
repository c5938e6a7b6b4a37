"""Load generator: closed-loop streaming benchmark of an OpenAI-compatible endpoint.

Knows URLs and HTTP only (no launchers, no search space, no Optuna). ``run_load`` returns
raw per-request records and the metrics derived from them (DOMAIN.md §3);
``compute_metrics`` is pure so figures can be recomputed from stored records.
"""

from __future__ import annotations

from autotune.loadgen.client import AbortRule, BenchResult, arun_load, run_load
from autotune.loadgen.estimate import LiveEstimate
from autotune.loadgen.metrics import (
    LatencyStats,
    Metrics,
    compute_metrics,
    latency_stats,
    rescale_time,
    slo_margins,
)
from autotune.loadgen.probe import aprobe_text, probe_text
from autotune.loadgen.records import RequestRecord
from autotune.loadgen.spec import SLO, LoadSpec
from autotune.loadgen.sse import SSEEvent, SSEParser

__all__ = [
    "SLO",
    "AbortRule",
    "BenchResult",
    "LatencyStats",
    "LiveEstimate",
    "LoadSpec",
    "Metrics",
    "RequestRecord",
    "SSEEvent",
    "SSEParser",
    "aprobe_text",
    "arun_load",
    "compute_metrics",
    "rescale_time",
    "latency_stats",
    "probe_text",
    "run_load",
    "slo_margins",
]
