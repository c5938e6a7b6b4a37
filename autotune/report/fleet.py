"""The fleet plan (shown when ``autotune plan`` stored its settings on the study): what each
planned configuration costs against its capacity per GPU, the cheapest that meets the target
marked, the table ``autotune plan`` prints, what was not planned and what the plan assumes.

The plan is recomputed from the study when the report is written
(:func:`autotune.plan.make_plan` on the stored :class:`~autotune.plan.PlanSettings`), so it
always matches the trials the other sections show.
"""

from __future__ import annotations

import plotly.graph_objects as go

from autotune.plan import FleetPlan, FleetRow
from autotune.report._common import _e, _note, _num, _pe, _plot, _section_open, _table
from autotune.report._data import ReportData


def section(data: ReportData) -> str | None:
    if data.plan_error is not None:
        return (
            _section_open("fleet", "Fleet plan")
            + _note(f"The stored fleet plan cannot be made: {data.plan_error}")
            + "</section>"
        )
    plan = data.plan
    if plan is None:
        return None
    s = plan.settings
    head = _section_open(
        "fleet",
        f"Fleet plan: {s.target_rate:g} req/s + {100 * s.headroom:g}% headroom",
    )
    parts = [
        head,
        f"<p>Sized for <b>{plan.provisioned_rate:g} req/s</b> (the target plus the headroom). "
        f"Per-replica rate: {_e(plan.rate_source)}.</p>",
    ]
    if plan.rows:
        cheapest = plan.cheapest
        if cheapest is not None:
            parts.append(
                f"<p>Cheapest that meets the target: <b>{_e(_describe(cheapest, plan))}</b>.</p>"
            )
        parts.append(_plot(_figure(plan), "plot-fleet"))
        parts.append(_rows_table(plan))
    if plan.unplannable:
        parts.append("<h3>Not planned</h3>")
        parts.append(
            _table(
                ["trial", "why"],
                [
                    [_e(f"{u.trial}" + (f" ({u.label})" if u.label else "")), _e(u.reason)]
                    for u in plan.unplannable
                ],
                numeric=set(),
            )
        )
    if plan.failed:
        parts.append(
            _note(
                "Did not run (not planned): "
                + ", ".join(f"{name} x{count}" for name, count in plan.failed.items())
            )
        )
    parts.append("<ul>" + "".join(f"<li>{_e(n)}</li>" for n in plan.notes) + "</ul>")
    parts.append(
        _note(
            f"The last `autotune plan --study {plan.study}` asked for this; run it again with "
            "other figures and write the report again to redraw it."
        )
    )
    return "\n".join(parts) + "</section>"


def _describe(r: FleetRow, plan: FleetPlan) -> str:
    text = f"{r.label} (trial {r.trial}): {r.replicas} replica(s)"
    if r.gpus is not None:
        text += f", {r.gpus} GPUs"
    if r.cost_per_hour is not None:
        text += f", {r.cost_per_hour:,.2f} per hour"
    return text


def _per_gpu(plan: FleetPlan) -> bool:
    return all(r.rate_per_gpu is not None for r in plan.rows)


def _figure(plan: FleetPlan) -> go.Figure:
    """Cost per hour (GPUs without a price; replicas without a GPU count) against the
    per-replica rate's lower bound per GPU (per replica without a GPU count): up and to the
    left costs more for less; the cheapest is a star, named. The dotted line is what the fleet
    would cost without rounding up to whole replicas. Every planned configuration meets the
    target (with enough replicas): the plot shows at what cost."""
    per_gpu, priced = _per_gpu(plan), plan.priced
    xs = [(r.rate_per_gpu if per_gpu else r.rate_lower) or 0.0 for r in plan.rows]

    def cost(r: FleetRow) -> float:
        if per_gpu and priced and r.cost_per_hour is not None:
            return r.cost_per_hour
        if per_gpu and r.gpus is not None:
            return float(r.gpus)
        return float(r.replicas)

    ys = [cost(r) for r in plan.rows]
    y_title = (
        "fleet cost per hour"
        if per_gpu and priced
        else ("GPUs in the fleet" if per_gpu else "replicas in the fleet")
    )
    x_title = (
        "capacity per GPU (req/s, lower 95% bound)"
        if per_gpu
        else "capacity per replica (req/s, lower 95% bound)"
    )
    fig = go.Figure()
    low, high = min(xs), max(xs)
    if low > 0:
        unit = plan.settings.gpu_hour_cost if per_gpu and priced else 1.0
        grid = [low * 0.8 + (high * 1.2 - low * 0.8) * i / 40 for i in range(41)]
        fig.add_trace(
            go.Scatter(
                x=grid,
                y=[plan.provisioned_rate / x * (unit or 1.0) for x in grid],
                mode="lines",
                name="without rounding up to whole replicas",
                line={"color": "#999", "dash": "dot"},
                hoverinfo="skip",
            )
        )
    others = [i for i, r in enumerate(plan.rows) if not r.cheapest]
    best = [i for i, r in enumerate(plan.rows) if r.cheapest]
    for group, name, marker in (
        (others, "planned configurations", {"size": 10, "color": "#1f77b4"}),
        (best, "the cheapest that meets the target", {"size": 20, "color": "#2ca02c"}),
    ):
        if not group:
            continue
        fig.add_trace(
            go.Scatter(
                x=[xs[i] for i in group],
                y=[ys[i] for i in group],
                mode="markers",
                name=name,
                marker={
                    **marker,
                    "symbol": "star" if group is best else "circle",
                    "line": {"width": 1, "color": "#333"},
                },
                hovertext=[_hover(plan.rows[i]) for i in group],
                hoverinfo="text",
            )
        )
    for i in best:
        r = plan.rows[i]
        fig.add_annotation(
            x=xs[i],
            y=ys[i],
            text=_pe(f"cheapest: {r.label}, trial {r.trial}"),
            showarrow=True,
            arrowhead=2,
            ax=0,
            ay=-40,
        )
    fig.update_layout(xaxis_title=x_title, yaxis_title=y_title)
    return fig


def _hover(r: FleetRow) -> str:
    lines = [
        f"{r.label}, trial {r.trial}" + (" (cheapest)" if r.cheapest else ""),
        f"{r.rate_mean:,.2f} req/s per replica (lower 95% bound {r.rate_lower:,.2f})",
        f"{r.replicas} replica(s)" + (f", {r.gpus} GPUs" if r.gpus is not None else ""),
    ]
    if r.cost_per_hour is not None:
        lines.append(f"{r.cost_per_hour:,.2f} per hour")
    if r.cost_per_million_tokens is not None:
        lines.append(f"{r.cost_per_million_tokens:,.3f} per million output tokens")
    if r.energy_per_token_j is not None:
        lines.append(f"{r.energy_per_token_j:.4g} J/token")
    return "<br>".join(_pe(line) for line in lines)


def _rows_table(plan: FleetPlan) -> str:
    """The table ``autotune plan`` prints: cost columns only with a price, J/token only where
    a trial recorded it."""
    energy = any(r.energy_per_token_j is not None for r in plan.rows)
    head = [
        "configuration",
        "trial",
        "levers changed",
        "req/s per replica (mean)",
        "lower 95%",
        "replicas",
        "GPUs / replica",
        "GPUs",
        "req/s per GPU",
    ]
    if plan.priced:
        head += ["cost / hour", "cost / M output tokens"]
    if energy:
        head.append("J/token")
    rows = []
    for r in plan.rows:
        label = _e(r.label) + (" <b>(cheapest)</b>" if r.cheapest else "")
        if r.notes:
            label += "".join(f"<br><i>{_e(n)}</i>" for n in r.notes)
        cells = [
            label,
            str(r.trial),
            "n/a" if r.changes is None else str(r.changes),
            _num(r.rate_mean, 2) + (" (at least)" if r.at_limit else ""),
            _num(r.rate_lower, 2),
            str(r.replicas),
            "n/a" if r.gpus_per_replica is None else str(r.gpus_per_replica),
            "n/a" if r.gpus is None else str(r.gpus),
            _num(r.rate_per_gpu, 3),
        ]
        if plan.priced:
            cells += [_num(r.cost_per_hour, 2), _num(r.cost_per_million_tokens, 3)]
        if energy:
            cells.append("n/a" if r.energy_per_token_j is None else f"{r.energy_per_token_j:.4g}")
        rows.append(cells)
    return _table(head, rows, numeric=set(range(1, len(head))))
