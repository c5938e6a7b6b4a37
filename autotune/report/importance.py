"""Parameter importances, labelled for what they are (shown when the study has enough
feasible trials for them).

Optuna's importance (PED-ANOVA over the feasible trials) says how much of the variation of
the objective across the trials a parameter accounts for: where the search found
differences. It does not say what a lever is worth at the winner: a lever whose poor values
sank trials ranks high even when the winner's value buys nothing over the baseline's. The
bundled study shows both at once (``mem_fraction_static`` first by importance, while the
explanation measures that reverting it at the winner costs nothing and drops it from the
minimal winner). So where ``autotune explain`` stored an explanation, each lever's measured
contribution stands beside its importance, in the plot and in a table, and the levers whose
two figures disagree are named in words; without one, the section says how to measure it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from autotune.explain import Effect, Explanation
from autotune.report._common import _e, _note, _pct, _pe, _plot, _section_open, _table
from autotune.report._data import ReportData
from autotune.report.explanation import rows_height
from autotune.report.waterfall import _interval, _measured

DISAGREE_TOP = 3
"""Levers this high by importance whose measured contribution is nil are named in words."""


def section(data: ReportData) -> str | None:
    importances = data.importances
    if not importances:
        return None
    head = _section_open("importance", "Parameter importances: where the trials varied")
    n = sum(1 for r in data.results if r.feasible and r.throughput is not None and r.params)
    intro = (
        f"<p>Optuna's importance (PED-ANOVA over the {n} feasible trials) is how much of the "
        f"variation of {_e(data.objective.what)} <b>across the trials</b> a parameter accounts "
        "for: where the search found differences. It is <b>not what a lever is worth at the "
        "winner</b>: a lever whose poor values sank trials ranks high even when the "
        "winner's value buys nothing over the baseline's.</p>"
    )
    e = data.explanation if data.explanation is not None and data.explanation.effects else None
    if e is None:
        hint = _note(
            "What each of the winner's changes is worth is measured by `autotune explain "
            f"--study {data.name}` (each change reverted alone, from freshly started "
            "services); the report then shows it beside each lever's importance."
        )
        return (
            head
            + intro
            + _plot(_figure(importances, None), "plot-importance")
            + hint
            + ("</section>")
        )
    levers = _levers(importances, e)
    parts = [
        head,
        intro,
        "<p>Beside each importance: the <b>measured contribution</b> of the winner's change "
        f"to that lever, from the explanation of trial #{e.winner} (the winner minus the "
        "winner with that change reverted, both from freshly started processes), as a share "
        "of the winner's gain over the baseline.</p>",
        _disagreements(levers, importances, e),
        _plot(
            _figure(importances, e, levers),
            "plot-importance",
            height=rows_height(levers, per=40),
        ),
        _lever_table(levers, importances, e),
    ]
    return "\n".join(p for p in parts if p) + "</section>"


def _levers(importances: Mapping[str, float], e: Explanation | None) -> list[str]:
    """By importance, largest first; then the levers the winner changed that Optuna has no
    figure for (derived, or not sampled)."""
    ordered = sorted(importances, key=lambda k: (-importances[k], k))
    extra = [] if e is None else [lv for x in e.effects for lv in x.levers if lv not in importances]
    return ordered + [lv for i, lv in enumerate(extra) if lv not in extra[:i]]


def _effects(e: Explanation) -> dict[str, Effect]:
    return {lever: x for x in e.effects for lever in x.levers}


def _gain(e: Explanation) -> float | None:
    win, base = e.winner_measured.mean, e.baseline_measured.mean
    if win is None or base is None or win.value - base.value <= 0:
        return None
    return win.value - base.value


def _figure(
    importances: Mapping[str, float], e: Explanation | None, levers: Sequence[str] | None = None
) -> go.Figure:
    """Importance bars, and beside each the measured contribution as a share of the gain
    (whiskers: its 95% interval) for the levers the winner changed."""
    names = list(levers) if levers is not None else _levers(importances, None)
    fig = go.Figure(
        go.Bar(
            y=[_pe(n) for n in names],
            x=[importances.get(n) for n in names],
            orientation="h",
            name="importance (where the trials varied)",
            marker={"color": "#9467bd"},
            hovertext=[f"{_pe(n)}<br>importance {_pct(importances.get(n))}" for n in names],
            hoverinfo="text",
        )
    )
    gain = None if e is None else _gain(e)
    if e is not None and gain is not None:
        effects = _effects(e)

        def share(lever: str, which: str) -> float | None:
            x = effects.get(lever)
            c = None if x is None else x.contribution
            v = None if c is None else getattr(c, which)
            return None if v is None else v / gain

        values = [share(n, "value") for n in names]
        fig.add_trace(
            go.Bar(
                y=[_pe(n) for n in names],
                x=values,
                orientation="h",
                name="measured contribution at the winner (share of the gain)",
                marker={"color": "#ff7f0e"},
                error_x={
                    "type": "data",
                    "symmetric": False,
                    "array": [
                        0.0 if v is None or (h := share(n, "high")) is None else abs(h - v)
                        for n, v in zip(names, values, strict=True)
                    ],
                    "arrayminus": [
                        0.0 if v is None or (lo := share(n, "low")) is None else abs(v - lo)
                        for n, v in zip(names, values, strict=True)
                    ],
                },
                hovertext=[_contribution_hover(n, effects.get(n), e.unit) for n in names],
                hoverinfo="text",
            )
        )
    fig.update_layout(
        barmode="group",
        xaxis={"title": "share", "tickformat": ".0%"},
        yaxis={"autorange": "reversed", "type": "category", "automargin": True},
        legend={"orientation": "h", "y": 1.08},
    )
    return fig


def _contribution_hover(lever: str, x: Effect | None, unit: str) -> str:
    if x is None:
        return f"{_pe(lever)}<br>not changed by the winner: nothing measured"
    if x.contribution is None:
        what = "required (without it the deployment fails)" if x.required else "not measured"
        return f"{_pe(lever)}<br>{what}"
    return f"{_pe(lever)}<br>contribution {_pe(_interval(x.contribution, unit))}"


def _minimal_word(e: Explanation, change: str) -> str:
    m = e.minimal
    if m is None:
        return "n/a"
    if change in m.dropped:
        return "dropped"
    if change in m.kept:
        return "kept"
    return "n/a"


def _lever_table(levers: Sequence[str], importances: Mapping[str, float], e: Explanation) -> str:
    effects, gain = _effects(e), _gain(e)
    rows = []
    for lever in levers:
        x = effects.get(lever)
        if x is None:
            rows.append(
                [_e(lever), _pct(importances.get(lever)), "not changed by the winner"] + ["n/a"] * 4
            )
            continue
        c = x.contribution
        share = "n/a"
        if c is not None and gain is not None:
            share = _pct(c.value / gain)
            if c.low is not None and c.high is not None:
                share += f" [{100 * c.low / gain:.1f}, {100 * c.high / gain:.1f}]"
        before, after = x.baseline.get(lever, "(inactive)"), x.winner.get(lever, "(inactive)")
        change = f"{_e(before)} -&gt; {_e(after)}"
        if x.change != lever:
            change += f"<br><i>{_e('changed together: ' + x.change)}</i>"
        if x.note and lever == x.levers[0]:  # said once per change, on its first lever
            change += f"<br><i>{_e(x.note)}</i>"
        contribution = (
            "required: without it the deployment fails"
            if x.required and c is None
            else (_interval(c) if c is not None else "not measured")
        )
        rows.append(
            [
                _e(lever),
                _pct(importances.get(lever)),
                change,
                _e(contribution),
                _e(share),
                _e(_minimal_word(e, x.change)),
                _e(_short(_measured(x.without, e.unit))),
            ]
        )
    return _table(
        [
            "lever",
            "importance (where the trials varied)",
            "baseline -> winner",
            f"measured contribution at the winner {e.unit} (95% interval)",
            "share of the gain",
            "minimal winner",
            "winner without it",
        ],
        rows,
        numeric={1, 3, 4},
    )


def _disagreements(levers: Sequence[str], importances: Mapping[str, float], e: Explanation) -> str:
    """The levers high by importance whose measured worth at the winner is nil, in words:
    where a reader would otherwise see a contradiction."""
    effects = _effects(e)
    lines = []
    for rank, lever in enumerate(levers[:DISAGREE_TOP], start=1):
        if lever not in importances:
            continue
        x = effects.get(lever)
        imp = _pct(importances[lever])
        if x is None:
            lines.append(
                f"{lever} ranks #{rank} by importance ({imp}), and the winner keeps the "
                "baseline's value: the explanation has nothing of it to revert; its importance "
                "is about the other values the trials tried."
            )
            continue
        c = x.contribution
        nil = c is not None and c.low is not None and c.high is not None and c.low <= 0 <= c.high
        dropped = e.minimal is not None and x.change in e.minimal.dropped
        if not (nil or dropped):
            continue
        measured = f"reverting it at the winner costs {_interval(c, e.unit)}" if c else ""
        lines.append(
            f"{lever} ranks #{rank} by importance ({imp}), yet "
            + (measured or "its revert was not measured")
            + (" (an interval that holds 0: nothing measurable)" if nil else "")
            + (", and the minimal winner drops it" if dropped else "")
            + "."
        )
    if not lines:
        return ""
    both = (
        "Both figures hold: the trials varied most with these levers (their poor values sank "
        "some trials), while at the winner's other settings their values buy nothing "
        "measurable."
    )
    return "<ul>" + "".join(f"<li>{_e(line)}</li>" for line in lines) + "</ul>" + _note(both)


def _short(text: str, limit: int = 160) -> str:
    """A failed run's reason can quote a whole garbled output: the table keeps its start."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
