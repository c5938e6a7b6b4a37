"""The front of tok/s per user against tok/s per GPU over every curve point (shown when a
trial recorded a curve), as InferenceMAX and NVIDIA draw it (:func:`nondominated`).

A trial records its deployment's name, not its GPU count: the count is the ``gpus:`` of the
deployment file of that name (:func:`autotune.plan.deployment_gpus`, read when the report
is written); without one the figures are per deployment.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go

from autotune.report._common import _e, _note, _plot, _section_open
from autotune.report._data import ReportData
from autotune.report._points import changes, curve, load, slo_line, value


def section(data: ReportData) -> str | None:
    """Every curve point as (tok/s per user, tok/s per GPU), and the points no other beats
    on both."""
    gpus, baseline = data.gpus, data.baseline
    trials = [r for r in data.results if r.complete and r.reused_from is None and curve(r)]
    if not trials:
        return None
    per_gpu = all((r.deployment or "") in gpus for r in trials)
    unit = "GPU" if per_gpu else "deployment"
    rows: list[tuple[float, float, str, bool]] = []  # x, y, hover, met the SLOs
    for r in trials:
        count = gpus[r.deployment or ""][0] if per_gpu else 1
        for p in curve(r):
            tpot, out = value(p, "tpot_mean"), value(p, "output_throughput")
            if tpot is None or tpot <= 0 or out is None or out <= 0:
                continue
            user, share = 1000.0 / tpot, out / count
            lines = [
                f"trial {r.number}",
                load(r, p),
                f"{user:,.1f} tok/s per user (TPOT mean {tpot:,.1f} ms)",
                f"{share:,.1f} tok/s per {unit}"
                + (f" ({out:,.1f} tok/s on {count} GPUs)" if per_gpu else ""),
                slo_line(p),
                *changes(r, baseline),
            ]
            rows.append((user, share, "<br>".join(_e(line) for line in lines), bool(p.get("ok"))))
    if not rows:  # no point has both a mean TPOT and an output throughput
        return None
    head = _section_open("frontier", f"Pareto front: tok/s per user vs tok/s per {unit}")
    front = nondominated([(row[0], row[1]) for row in rows])
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[row[0] for row in rows],
            y=[row[1] for row in rows],
            mode="markers",
            name="curve points (all configurations)",
            marker={
                "color": "#1f77b4",
                "size": 7,
                "opacity": 0.35,
                "symbol": ["circle" if row[3] else "circle-open" for row in rows],
            },
            text=[row[2] for row in rows],
            hoverinfo="text",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[rows[i][0] for i in front],
            y=[rows[i][1] for i in front],
            mode="lines+markers",
            name="Pareto front",
            line={"color": "#2ca02c"},
            marker={"color": "#2ca02c", "size": 10, "symbol": "diamond"},
            text=[rows[i][2] for i in front],
            hoverinfo="text",
        )
    )
    fig.update_layout(
        xaxis_title="interactivity: tok/s per user (higher is better)",
        yaxis_title=f"output tok/s per {unit} (higher is better)",
    )
    if per_gpu:
        counts = sorted({(r.deployment or "", *gpus[r.deployment or ""]) for r in trials})
        source = (
            "tok/s per GPU = output throughput / the GPUs the deployment occupies (its "
            "file's gpus:, read when this report was written: "
            + "; ".join(f"{name}: {n} from {where}" for name, n, where in counts)
            + ")."
        )
    else:
        unknown = sorted({r.deployment or "(none recorded)" for r in trials} - set(gpus))
        source = (
            "tok/s per deployment = output throughput of the whole deployment: the GPU "
            f"count of {', '.join(unknown)} is unknown (no deployment file of that name "
            "with gpus: was found)."
        )
    note = _note(
        "Each faint marker is one point of a trial's latency-throughput curve; the line "
        "joins the points that no other point beats on both axes (hollow: the point broke "
        "an SLO; the front ignores SLOs). tok/s per user = 1000 / "
        "mean TPOT in ms: the decode speed one user sees (interactivity). " + source
    )
    return head + _plot(fig, "plot-frontier") + note + "</section>"


def nondominated(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point dominates when both coordinates are maximized,
    in increasing x (so decreasing y): a point is dominated by one at least as high on both
    axes and higher on one. Of points equal on both, only the first is kept (one marker per
    place on the line); a point with a non-finite coordinate is never on the front."""
    order = sorted(
        (i for i, (x, y) in enumerate(points) if math.isfinite(x) and math.isfinite(y)),
        key=lambda i: (-points[i][0], -points[i][1], i),
    )
    front: list[int] = []
    highest = -math.inf
    for i in order:  # by x from the right: on the front iff higher than everything so far
        if points[i][1] > highest:
            front.append(i)
            highest = points[i][1]
    return front[::-1]
