"""The optimization history: each completed trial's first objective, and the best feasible
so far (shown once a trial completed with a value)."""

from __future__ import annotations

import math

import plotly.graph_objects as go

from autotune.report._common import _feasibility_traces, _plot, _section_open
from autotune.report._data import ReportData


def section(data: ReportData) -> str | None:
    objective = data.objective
    done = [r for r in data.results if r.complete and r.throughput is not None]
    if not done:
        return None
    head = _section_open("history", "Optimization history")
    fig = go.Figure()
    _feasibility_traces(fig, done, lambda r: (r.number, r.throughput), objective.unit)
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
