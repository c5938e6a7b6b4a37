"""The Pareto front of the first objective against TPOT p99 (shown when a trial was measured
with both)."""

from __future__ import annotations

import plotly.graph_objects as go

from autotune.report._common import _feasibility_traces, _front, _note, _plot, _section_open
from autotune.report._data import ReportData


def section(data: ReportData) -> str | None:
    objective, best, baseline = data.objective, data.best, data.baseline
    points = [r for r in data.results if r.measured and r.tpot_p99_ms is not None]
    if not points:
        return None
    head = _section_open("pareto", f"{objective.title} vs TPOT p99 (Pareto front)")
    fig = go.Figure()
    feasible = _feasibility_traces(
        fig,
        points,
        lambda r: (r.throughput, r.tpot_p99_ms),
        objective.unit,
        feasible=("feasible", {"color": "#1f77b4", "size": 9}),
        infeasible="infeasible (constraint violated)",
    )
    front = _front(feasible)
    if front:
        fig.add_trace(
            go.Scatter(
                x=[r.throughput for r in front],
                y=[r.tpot_p99_ms for r in front],
                mode="lines+markers",
                name="Pareto front (feasible)",
                line={"color": "#2ca02c", "shape": "vh"},
                marker={"color": "#2ca02c", "size": 11, "symbol": "diamond-open"},
                hoverinfo="skip",
            )
        )
    for label, r, symbol in (("baseline", baseline, "star"), ("best", best, "star-diamond")):
        if r is not None and r in points:
            fig.add_trace(
                go.Scatter(
                    x=[r.throughput],
                    y=[r.tpot_p99_ms],
                    mode="markers",
                    name=f"{label} (trial {r.number})",
                    marker={"size": 16, "symbol": symbol, "line": {"width": 1}},
                    hoverinfo="skip",
                )
            )
    unit = f"{objective.unit}, " if objective.unit else ""
    fig.update_layout(
        xaxis_title=f"{objective.what} ({unit}higher is better)",
        yaxis_title="TPOT p99 (ms, lower is better)",
    )
    skipped = len([r for r in data.results if r.complete]) - len(points)
    extra = _note(f"{skipped} trial(s) without a measurement (failed) are not plotted.")
    return head + _plot(fig, "plot-pareto") + (extra if skipped > 0 else "") + "</section>"
