"""The explanation's waterfall: from the baseline's mean, one bar per measured step of
the path, to the winner's (:func:`waterfall_bars` computes the bars, :func:`waterfall_figure`
draws them), and the formatting of measured means and intervals the explanation section
shares.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from autotune.explain import Effect, Explanation, Interval, Measured
from autotune.report._common import _num, _pe


@dataclass(frozen=True)
class WaterfallBar:
    """One bar of the explanation's waterfall (:func:`waterfall_bars`)."""

    label: str
    """Plotly markup: escaped, with line breaks."""
    measure: str
    """``absolute`` (the baseline), ``relative`` (a step) or ``total`` (the winner)."""
    value: float
    interval: Interval | None
    """The 95% interval of ``value`` (of the step for a relative bar); None without one."""
    hover: str
    """Plotly markup: escaped lines joined by ``<br>``."""


def waterfall_bars(e: Explanation) -> list[WaterfallBar] | None:
    """The baseline's mean, one bar per measured path step (a step that has no measurement
    yet, or failed, goes with the next one), then the winner's mean; without a path, the
    leave-one-out contributions largest first and the remainder that ends at the winner
    (contributions do not add up when changes interact). None without both means."""
    base, win = e.baseline_measured.mean, e.winner_measured.mean
    if base is None or win is None:
        return None
    effects = {x.change: x for x in e.effects}
    unit = e.unit
    bars = [
        WaterfallBar(
            "baseline",
            "absolute",
            base.value,
            _bounded(base),
            _lines(["the baseline", _measured(e.baseline_measured, unit)]),
        )
    ]
    last = base.value
    if e.path:
        pending: list[str] = []
        for step in e.path:
            pending += step.added
            m = step.measured.mean
            if m is None:
                continue
            value = step.step.value if step.step is not None else m.value - last
            lines = [
                *_levers(pending, effects),
                f"measured {_measured(step.measured, unit)}",
                f"step {_interval(step.step, unit) if step.step else _signed(value, unit)}",
            ]
            if step.note:
                lines.append(step.note)
            if pending != step.added:
                lines.append("with the changes of the steps before it, which have no measurement")
            bars.append(
                WaterfallBar(_label(pending), "relative", value, _bounded(step.step), _lines(lines))
            )
            last, pending = m.value, []
        if pending or not math.isclose(last, win.value, rel_tol=1e-9, abs_tol=1e-9):
            rest = ", ".join(pending) or "nothing"
            bars.append(
                WaterfallBar(
                    _label(pending) if pending else "the rest",
                    "relative",
                    win.value - last,
                    None,
                    _lines([f"to the winner (not measured along the path: {rest})"]),
                )
            )
    else:
        measured = sorted(
            (x for x in e.effects if x.contribution is not None),
            key=lambda x: -(x.contribution.value if x.contribution else 0.0),
        )
        for x in measured:
            assert x.contribution is not None
            lines = [
                *_levers([x.change], effects),
                f"winner without it {_measured(x.without, unit)}",
                f"contribution {_interval(x.contribution, unit)}",
            ]
            if x.note:
                lines.append(x.note)
            bars.append(
                WaterfallBar(
                    _label([x.change]),
                    "relative",
                    x.contribution.value,
                    _bounded(x.contribution),
                    _lines(lines),
                )
            )
            last += x.contribution.value
        missing = [
            x.change + (" (required: without it the deployment fails)" if x.required else "")
            for x in e.effects
            if x.contribution is None
        ]
        lines = [
            "the winner minus the baseline minus the contributions above:",
            "what the changes do together beyond each alone",
        ]
        if missing:
            lines.append("and the changes whose revert has no measurement:")
            lines += [f"  {m}" for m in missing]
        bars.append(
            WaterfallBar(
                "interactions and the rest", "relative", win.value - last, None, _lines(lines)
            )
        )
    bars.append(
        WaterfallBar(
            f"winner (trial #{e.winner})",
            "total",
            win.value,
            _bounded(win),
            _lines([f"the winner, trial #{e.winner}", _measured(e.winner_measured, unit)]),
        )
    )
    return bars


def waterfall_figure(bars: Sequence[WaterfallBar], e: Explanation) -> go.Figure:
    """A horizontal waterfall (the baseline on top); the bars' 95% intervals as whiskers at
    each bar's end (a plotly waterfall draws no error bars) and each bar's figure right of
    its whisker (bar text would sit on it)."""
    fig = go.Figure(
        go.Waterfall(
            orientation="h",
            name="measured",
            y=[b.label for b in bars],
            x=[b.value for b in bars],
            measure=[b.measure for b in bars],
            textinfo="none",
            hovertext=[b.hover for b in bars],
            hoverinfo="text",
            connector={"line": {"color": "#999", "dash": "dot"}},
            increasing={"marker": {"color": "#2ca02c"}},
            decreasing={"marker": {"color": "#d62728"}},
            totals={"marker": {"color": "#1f77b4"}},
        )
    )
    ends: list[float] = []
    rights: list[float] = []  # where a bar's drawing ends on the right: its figure goes there
    lefts: list[float] = [0.0]
    for b in bars:
        start = ends[-1] if b.measure == "relative" and ends else 0.0
        end = start + b.value if b.measure == "relative" else b.value
        ends.append(end)
        iv = b.interval
        high = end + (iv.high or 0.0) - b.value if iv is not None else end
        low = end - b.value + (iv.low or 0.0) if iv is not None else end
        rights.append(max(start, end, high))
        lefts += [start, end, low]
    whiskers = [(i, b.interval) for i, b in enumerate(bars) if b.interval is not None]
    if whiskers:
        fig.add_trace(
            go.Scatter(
                x=[ends[i] for i, _ in whiskers],
                y=[bars[i].label for i, _ in whiskers],
                mode="markers",
                name="95% interval",
                marker={"color": "#555", "size": 3},
                error_x={
                    "type": "data",
                    "symmetric": False,
                    "array": [(iv.high or 0.0) - bars[i].value for i, iv in whiskers],
                    "arrayminus": [bars[i].value - (iv.low or 0.0) for i, iv in whiskers],
                    "color": "#555",
                    "thickness": 1.2,
                },
                hoverinfo="skip",
            )
        )
    for b, right in zip(bars, rights, strict=True):
        fig.add_annotation(
            x=right,
            y=b.label,
            text=_signed(b.value) if b.measure == "relative" else _num(b.value),
            showarrow=False,
            xanchor="left",
            xshift=4,
            font={"size": 11},
        )
    span = max(rights) - min(lefts)
    fig.update_layout(
        xaxis={
            "title": f"{e.objective} ({e.unit})" if e.unit else e.objective,
            "range": [min(lefts) - 0.02 * span, max(rights) + 0.12 * span],
        },
        yaxis={"autorange": "reversed", "type": "category", "automargin": True},
        showlegend=False,
    )
    return fig


def _levers(names: Sequence[str], effects: Mapping[str, Effect]) -> list[str]:
    """Hover lines: the changes named, then each lever's ``baseline -> winner``."""
    lines = [" + ".join(names)]
    for name in names:
        x = effects.get(name)
        if x is None:
            continue
        for lever in x.levers:
            lines.append(f"  {lever}: {_shown(x.baseline, lever)} -> {_shown(x.winner, lever)}")
    return lines


def _shown(values: Mapping[str, object], lever: str) -> str:
    return str(values[lever]) if lever in values else "(inactive)"


def _label(names: Sequence[str], width: int = 36) -> str:
    """An axis label: the levers escaped, broken into lines of about ``width`` characters
    (a grouped change's name runs to 80, which would squeeze the plot)."""
    parts = [part for name in names for part in name.split(" + ")]
    lines: list[str] = []
    line = ""
    for part in parts:
        if line and len(line) + 3 + len(part) > width:
            lines.append(line + " +")
            line = part
        else:
            line = f"{line} + {part}" if line else part
    lines.append(line)
    return "<br>".join(_pe(x) for x in lines)


def _lines(lines: Sequence[str]) -> str:
    return "<br>".join(_pe(line) for line in lines)


def _bounded(x: Interval | Measured | None) -> Interval | None:
    """The interval when it has bounds (a mean's, for a measurement)."""
    iv = x.mean if isinstance(x, Measured) else x
    return iv if iv is not None and iv.low is not None and iv.high is not None else None


def _measured(m: Measured, unit: str) -> str:
    """``338.3 +- 11.9 tok/s (n=3)``, or why there is no mean."""
    if m.mean is None:
        return f"failed: {m.failure}" if m.failure else "not measured"
    half = "" if m.mean.high is None else f" ± {_num(m.mean.high - m.mean.value)}"
    slo = f", {m.infeasible} broke an SLO" if m.infeasible else ""
    unit = f" {unit}" if unit else ""
    return f"{_num(m.mean.value)}{half}{unit} (n={m.n}{slo})"


def _signed(value: float, unit: str = "") -> str:
    return f"{value:+,.1f} {unit}".rstrip()


def _interval(x: Interval | None, unit: str = "") -> str:
    """``+9.6 [-9.0, +28.1] tok/s``."""
    if x is None:
        return "n/a"
    text = f"{x.value:+,.1f}"
    if x.low is not None and x.high is not None:
        text += f" [{x.low:+,.1f}, {x.high:+,.1f}]"
    return f"{text} {unit}".rstrip()
