"""The optimization history: each completed trial's first objective, and the best feasible
so far (shown once a trial completed with a value)."""

from __future__ import annotations

import math

import plotly.graph_objects as go

from autotune.report._common import _hover, _plot, _section_open
from autotune.report._data import ReportData


def section(data: ReportData) -> str | None:
    objective = data.objective
    done = [r for r in data.results if r.complete and r.throughput is not None]
    if not done:
        return None
    head = _section_open("history", "Optimization history")
    fig = go.Figure()
    feasible = [r for r in done if r.feasible]
    infeasible = [r for r in done if not r.feasible]
    for group, name, marker in (
        (feasible, "feasible", None),
        (infeasible, "infeasible", {"color": "#d62728", "symbol": "x"}),
    ):
        if group:
            fig.add_trace(
                go.Scatter(
                    x=[r.number for r in group],
                    y=[r.throughput for r in group],
                    mode="markers",
                    name=name,
                    marker=marker,
                    text=[_hover(r, objective.unit) for r in group],
                    hoverinfo="text",
                )
            )
    xs, ys, best = [], [], -math.inf
    for r in done:
        if r.feasible and r.throughput is not None:
            best = max(best, r.throughput)
        if best > -math.inf:
            xs.append(r.number)
            ys.append(best)
    if xs:
        fig.add_trace(
            go.Scatter(x=xs, y=ys, mode="lines", name="best so far (feasible)", line_shape="hv")
        )
    fig.update_layout(xaxis_title="trial", yaxis_title=objective.axis)
    return head + _plot(fig, "plot-history") + "</section>"
