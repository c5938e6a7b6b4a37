"""Reading the curve points a trial stored (``TrialResult.curve``: capacity probes or a
``curve:`` sweep) and the hover text both curve sections share."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.report._common import _e, _num
from autotune.results import TrialResult


def curve(r: TrialResult) -> list[Mapping[str, Any]]:
    """The trial's curve points that have an output throughput, in the stored order."""
    return [
        p for p in r.curve if isinstance(p, Mapping) and value(p, "output_throughput") is not None
    ]


def value(point: Mapping[str, Any], key: str) -> float | None:
    """A finite number of a point; None when absent or not a number."""
    v = point.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def capacity_index(r: TrialResult, points: Sequence[Mapping[str, Any]]) -> int | None:
    """Where the capacity a capacity search found lies on its curve (its passing probe)."""
    capacity = value(r.capacity or {}, "capacity")
    if capacity is None or capacity <= 0:
        return None
    hits = [
        j
        for j, p in enumerate(points)
        if p.get("ok") and (x := value(p, "x")) is not None and math.isclose(x, capacity)
    ]
    return hits[-1] if hits else None


def point_hover(
    r: TrialResult, p: Mapping[str, Any], baseline: TrialResult | None, *, capacity: bool
) -> str:
    lines = [
        f"trial {r.number}",
        load(r, p),
        f"{_num(value(p, 'output_throughput'))} tok/s",
        f"TTFT p99 {_num(value(p, 'ttft_p99'))} ms",
        f"TPOT p99 {_num(value(p, 'tpot_p99'))} ms",
        slo_line(p),
    ]
    if capacity:
        lines.append("capacity (the highest passing load)")
    lines += changes(r, baseline)
    return "<br>".join(_e(line) for line in lines)


def load(r: TrialResult, p: Mapping[str, Any]) -> str:
    """The load a point was measured at: a request rate or a concurrency when the trial
    says which (a capacity search does), else the bare figure."""
    x = value(p, "x")
    shown = "n/a" if x is None else f"{x:g}"
    over = (r.capacity or {}).get("over")
    if over == "rate":
        return f"rate {shown} req/s"
    if over == "concurrency":
        return f"concurrency {shown}"
    return f"load {shown}"


def slo_line(p: Mapping[str, Any]) -> str:
    if p.get("ok"):
        return "met the SLOs"
    broke = [str(v) for v in p.get("violations") or []]
    return "broke: " + ("; ".join(broke) if broke else "an SLO")


def changes(r: TrialResult, baseline: TrialResult | None, limit: int = 8) -> list[str]:
    """Hover lines: the levers whose values differ from the baseline's configuration."""
    if baseline is None:
        return []
    if r.number == baseline.number:
        return ["the baseline"]
    missing = object()
    keys = sorted(set(r.config) | set(baseline.config))
    diff = [
        f"  {k} = {r.config[k]}" if k in r.config else f"  {k}: inactive"
        for k in keys
        if r.config.get(k, missing) != baseline.config.get(k, missing)
    ]
    if not diff:
        return ["same configuration as the baseline"]
    more = [f"  ... {len(diff) - limit} more"] if len(diff) > limit else []
    return ["changed vs baseline:", *diff[:limit], *more]


def config_key(r: TrialResult) -> str:
    return json.dumps(r.config, sort_keys=True, default=str) if r.config else f"#{r.number}"
