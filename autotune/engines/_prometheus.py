"""Prometheus text exposition, as engines serve it on ``/metrics``, read into plain numbers.

Only what a measurement window needs: every sample's name, labels and value, and each family's
declared type (``# TYPE``). A window is two scrapes (before and after the measured phase) plus
the scrapes taken in between: counters and histograms are differenced, gauges are summarised
over the scrapes inside the window (a gauge read after the load stopped says nothing).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

_SAMPLE_RE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass
class Scrape:
    """One ``/metrics`` answer: sample name -> [(labels, value)], family name -> type."""

    samples: dict[str, list[tuple[tuple[tuple[str, str], ...], float]]] = field(
        default_factory=dict
    )
    types: dict[str, str] = field(default_factory=dict)

    def total(self, name: str) -> float | None:
        """The sum over every label set of sample ``name`` (``None``: not exported)."""
        rows = self.samples.get(name)
        if not rows:
            return None
        return sum(v for _, v in rows if not math.isnan(v))

    def peak(self, name: str) -> float | None:
        rows = self.samples.get(name)
        if not rows:
            return None
        values = [v for _, v in rows if not math.isnan(v)]
        return max(values) if values else None

    def kind(self, name: str) -> str:
        """``counter``, ``gauge``, ``histogram``, ``summary`` or ``untyped``; a counter's
        family is declared without its ``_total`` suffix."""
        for family in (name, name.removesuffix("_total")):
            if family in self.types:
                return self.types[family]
        return "untyped"


def parse(text: str) -> Scrape:
    """The samples of a text exposition; malformed lines are skipped (a scrape is evidence
    beside the measurement, never a reason to fail a trial)."""
    out = Scrape()
    for line in text.splitlines():
        if not line or line[0] == "#":
            parts = line.split()
            if len(parts) >= 4 and parts[1] == "TYPE":
                out.types[parts[2]] = parts[3]
            continue
        m = _SAMPLE_RE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = tuple(sorted(_LABEL_RE.findall(m.group(2) or "")))
        out.samples.setdefault(m.group(1), []).append((labels, value))
    return out


SUMMED_GAUGES = frozenset({"running", "queued"})
"""Gauges that add up across label sets (data-parallel engines); the others take the peak."""


def summarize(
    names: Mapping[str, str],
    before: Scrape,
    after: Scrape,
    during: Sequence[Scrape] = (),
) -> dict[str, float]:
    """What the server counted in a window, keyed by autotune's field names.

    ``names``: field -> metric name (:meth:`EngineMetrics.names`). Counters give the increase
    (``preemptions``), histograms the mean and count of what was observed in the window
    (``ttft_mean_s``, ``ttft_count``), gauges the peak and mean over the scrapes ``during``
    the window (``kv_usage_max``, ``kv_usage_mean``). A counter that went down (the server
    restarted in between) is left out rather than reported negative.
    """
    out: dict[str, float] = {}
    for key, metric in names.items():
        kind = after.kind(metric)
        if kind == "histogram" or after.total(f"{metric}_count") is not None:
            _histogram(out, key, metric, before, after)
        elif kind == "counter" or metric.endswith("_total"):
            delta = _delta(metric, before, after)
            if delta is not None:
                out[key] = delta
        else:
            _gauge(out, key, metric, during)
    _ratio(out, "prefix_cache_hit_rate", "prefix_cache_hits", "prefix_cache_queries")
    _ratio(out, "spec_acceptance_rate", "spec_accepted", "spec_drafted")
    return out


def _delta(name: str, before: Scrape, after: Scrape) -> float | None:
    end = after.total(name)
    if end is None:
        return None
    start = before.total(name) or 0.0
    return end - start if end >= start else None


def _histogram(out: dict[str, float], key: str, metric: str, before: Scrape, after: Scrape) -> None:
    count = _delta(f"{metric}_count", before, after)
    total = _delta(f"{metric}_sum", before, after)
    if count is None or total is None:
        return
    out[f"{key}_count"] = count
    if count > 0:
        out[f"{key}_mean_s" if metric.endswith("_seconds") else f"{key}_mean"] = total / count


def _gauge(out: dict[str, float], key: str, metric: str, during: Iterable[Scrape]) -> None:
    read = Scrape.total if key in SUMMED_GAUGES else Scrape.peak
    values = [v for v in (read(s, metric) for s in during) if v is not None]
    if values:
        out[f"{key}_max"] = max(values)
        out[f"{key}_mean"] = sum(values) / len(values)


def _ratio(out: dict[str, float], key: str, part: str, whole: str) -> None:
    if out.get(whole):
        out[key] = out.get(part, 0.0) / out[whole]
