"""The latency-throughput curves of the best configurations (shown when a trial recorded a
curve: a capacity search's probes or a ``curve:`` sweep)."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from autotune.report._common import _note, _plot, _ranked, _section_open
from autotune.report._data import ReportData
from autotune.report._points import capacity_index, config_key, curve, point_hover, value
from autotune.results import TrialResult

CURVE_TOP_N = 5
"""Configurations whose latency-throughput curves are drawn (plus the baseline's)."""


def section(data: ReportData) -> str | None:
    """p99 TTFT and p99 TPOT against output throughput along the curves of the best
    :data:`CURVE_TOP_N` distinct feasible configurations that have one (the top table's
    ranking) and the baseline's."""
    results, baseline = data.results, data.baseline
    if not any(curve(r) for r in results):
        return None
    chosen = curve_configs(results, baseline)
    if not chosen:  # only infeasible configurations have one: the front below draws them
        return None
    head = _section_open("curves", "Latency-throughput curves")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1)
    palette = qualitative.Plotly
    for i, r in enumerate(chosen):
        points = curve(r)
        at = capacity_index(r, points)
        name = f"trial {r.number}" + (" (baseline)" if r.is_baseline else "")
        color = palette[i % len(palette)]
        marker = {
            "color": color,
            "symbol": [
                "star" if j == at else ("circle" if p.get("ok") else "circle-open")
                for j, p in enumerate(points)
            ],
            "size": [16 if j == at else 9 for j in range(len(points))],
            "line": {"color": color, "width": 1.5},
        }
        text = [point_hover(r, p, baseline, capacity=j == at) for j, p in enumerate(points)]
        for col, key in ((1, "ttft_p99"), (2, "tpot_p99")):
            fig.add_trace(
                go.Scatter(
                    x=[value(p, "output_throughput") for p in points],
                    y=[value(p, key) for p in points],
                    mode="lines+markers",
                    name=name,
                    legendgroup=name,
                    showlegend=col == 1,
                    line={"color": color},
                    marker=marker,
                    text=text,
                    hoverinfo="text",
                ),
                row=1,
                col=col,
            )
    fig.update_xaxes(title_text="output throughput (tok/s)")
    fig.update_yaxes(title_text="TTFT p99 (ms)", row=1, col=1)
    fig.update_yaxes(title_text="TPOT p99 (ms)", row=1, col=2)
    note = _note(
        f"One line per configuration (the best {CURVE_TOP_N} distinct feasible ones with a "
        "curve, by the first objective, and the baseline), in the order the loads were "
        "swept; filled markers met every SLO, hollow ones broke one, a star is the capacity "
        "a capacity search found. Latencies and throughputs are on the modeled hardware's "
        "clock."
    )
    return head + _plot(fig, "plot-curves") + note + "</section>"


def curve_configs(results: list[TrialResult], baseline: TrialResult | None) -> list[TrialResult]:
    """The trials whose curves are drawn: the best :data:`CURVE_TOP_N` distinct feasible
    configurations with a curve, then the baseline if it has one and is not among them."""
    chosen: list[TrialResult] = []
    seen: set[str] = set()
    for r in _ranked(results):
        key = config_key(r)
        if not curve(r) or key in seen:
            continue
        seen.add(key)
        chosen.append(r)
        if len(chosen) == CURVE_TOP_N:
            break
    if baseline is not None and curve(baseline) and config_key(baseline) not in seen:
        chosen.append(baseline)
    return chosen
