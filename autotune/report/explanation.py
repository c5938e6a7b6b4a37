"""The report's explanation section: what ``autotune explain`` stored
(:func:`autotune.explain.load_explanation`), drawn as the waterfall from the baseline to
the winner (:mod:`autotune.report.waterfall`), the minimal winner beside the full one, and
each change's measured contribution beside Optuna's importance of its levers; before an
explanation it says how to get one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import optuna
import plotly.graph_objects as go

from autotune.errors import StorageError
from autotune.explain import Explanation, Interval, Measured, load_explanation
from autotune.report._common import _e, _note, _pct, _pe, _plot, _section_open, _table
from autotune.report.waterfall import (
    _interval,
    _label,
    _levers,
    _measured,
    _signed,
    waterfall_bars,
    waterfall_figure,
)
from autotune.results import (
    ConfigEstimate,
    t_quantile,
)

NO_EXPLANATION = (
    "No explanation yet: `autotune explain --study {study}` measures what each of the "
    "winner's changes from the baseline bought (each reverted alone, from freshly started "
    "services), the path from the baseline and the minimal winner."
)


def _explanation(
    study: optuna.Study, importances: Mapping[str, float], winner: ConfigEstimate | None
) -> str:
    """What ``autotune explain`` measured (:class:`autotune.explain.Explanation`): the
    waterfall from the baseline to the winner, the minimal winner beside the full one, and
    the measured contributions beside Optuna's importances (which answer another question)."""
    head = _section_open("explanation", "Explanation: what each change bought")
    try:
        e = load_explanation(study)
    except StorageError as exc:
        return head + _note(f"The stored explanation cannot be read: {exc}") + "</section>"
    if e is None:
        return head + _note(NO_EXPLANATION.format(study=study.study_name)) + "</section>"
    parts = [head, _explanation_intro(e, study.study_name, winner)]
    if not e.effects:
        parts.append(_note(f"Trial #{e.winner} has the baseline's configuration: no change."))
        return "\n".join(parts) + "</section>"
    bars = waterfall_bars(e)
    if bars is None:
        parts.append(_note("The winner or the baseline has no measurement: no waterfall."))
    else:
        parts.append(_plot(waterfall_figure(bars, e), "plot-explain", height=_rows_height(bars)))
        how = (
            "each bar adds the changes named to the configuration above it (largest first), "
            "as measured along the path from the baseline"
            if e.path
            else "each bar is what reverting that change alone from the winner costs "
            "(leave-one-out, largest first; the path was not measured); the last one is "
            "what the changes do together beyond each alone, and the ones not measured"
        )
        parts.append(
            _note(
                f"From the baseline's measured mean to the winner's ({e.unit}): {how}. "
                "Whiskers: 95% intervals; hover a bar for its levers."
            )
        )
    parts.append(_minimal(e, study.study_name))
    parts.append(_contributions(e, importances))
    return "\n".join(parts) + "</section>"


def _explanation_intro(e: Explanation, study_name: str, winner: ConfigEstimate | None) -> str:
    unit = e.unit
    win, base = e.winner_measured, e.baseline_measured
    text = (
        f"<p>Trial <b>#{e.winner}</b>: {_e(_measured(win, unit))} against the baseline's "
        f"{_e(_measured(base, unit))}"
    )
    if win.mean is not None and base.mean is not None:
        text += f", a gain of <b>{_e(_signed(win.mean.value - base.mean.value, unit))}</b>"
    noise = (
        ""
        if e.noise_sd is None
        else f"; run-to-run noise {100 * e.noise_sd:.1f} % ({e.noise_df} degrees of freedom)"
    )
    text += (
        f"{_e(noise)}. {e.runs} run(s), each from freshly started services, "
        f"{len(e.effects)} change(s) from the baseline.</p>"
    )
    notes = []
    if not e.complete:
        why = e.stopped or "not finished"
        if why == "in progress":  # stored after each decision; the process may be gone
            why = "in progress, or interrupted"
        notes.append(
            f"This explanation is incomplete (stopped: {why}): what is shown is what was "
            f"measured so far; `autotune explain --study {study_name}` resumes it."
        )
    if winner is not None and winner.trial.number != e.winner:
        notes.append(
            f"The study's winner is now trial #{winner.trial.number}: this explains trial "
            f"#{e.winner}; `autotune explain --study {study_name}` explains the new one."
        )
    return text + "".join(_note(n) for n in notes)


def _minimal(e: Explanation, study_name: str) -> str:
    """The full winner, the minimal one and the baseline side by side, then what was
    dropped and every decision in the order taken."""
    head = "<h3>The minimal winner beside the full one</h3>\n"
    m = e.minimal
    if m is None:
        return head + _note(
            "No minimal winner: its search is off (--no-minimal), or has not started (the "
            "ablation comes first)."
        )
    unit, win, base = e.unit, e.winner_measured, e.baseline_measured
    n = len(e.effects)
    rows = [
        [
            _e(f"full winner (trial #{e.winner})"),
            _e(f"all {n}"),
            _e(_measured(win, unit)),
            "1.00x",
        ],
        [
            "<b>minimal winner</b>",
            "<br>".join([_e(f"{len(m.kept)} of {n}:"), *(_e(k) for k in m.kept)]),
            _e(_measured(m.measured, unit)),
            _e(_times(m.ratio)),
        ],
        [
            "baseline",
            "none",
            _e(_measured(base, unit)),
            _e(_times(_ratio_of(base, win, e.noise_sd, e.noise_df))),
        ],
    ]
    table = _table(
        ["what", "changes", f"measured mean {unit} (95% CI)", "vs winner (95% interval)"],
        rows,
        numeric={3},
    )
    dropped = (
        f"<p>Dropped ({len(m.dropped)}): "
        + (", ".join(f"<b>{_e(d)}</b>" for d in m.dropped) or "none")
        + "</p>"
    )
    rule = _note(
        "Backward elimination, smallest contribution first: a change is dropped when the "
        "configuration without it keeps its lower 95% bound within "
        f"{100 * e.tolerance:g}% of the winner's (the bound `best` ranks by). "
        f"`autotune best --study {study_name} --minimal` exports it."
    )
    if not m.complete:
        rule += _note("The search did not finish: the changes not tried yet are kept.")
    decisions = _table(
        ["#", "action", "change", "why"],
        [
            [str(i), _e(d.action), _e(d.change), _e(d.why)]
            for i, d in enumerate(m.decisions, start=1)
        ],
        numeric={0},
    )
    return head + table + dropped + rule + "<h4>Decisions, in the order taken</h4>" + decisions


def _contributions(e: Explanation, importances: Mapping[str, float]) -> str:
    """Each change's Optuna importance (summed over its levers) beside its measured
    contribution, as a table and as two bars per change."""
    head = "<h3>Importances next to measured contributions</h3>\n"
    win, base = e.winner_measured.mean, e.baseline_measured.mean
    gain = win.value - base.value if win is not None and base is not None else None
    share_of = (lambda v: v / gain) if gain is not None and gain > 0 else None
    ordered = sorted(
        enumerate(e.effects),
        key=lambda item: (
            0 if item[1].required else (1 if item[1].contribution is not None else 2),
            -(item[1].contribution.value if item[1].contribution else 0.0),
            item[0],
        ),
    )
    effects = [x for _, x in ordered]
    shares = [_importance_share(x.levers, importances) for x in effects]
    rows = []
    for x, imp in zip(effects, shares, strict=True):
        label = _e(x.change) + (" <b>(required)</b>" if x.required else "")
        if x.note:
            label += f"<br><i>{_e(x.note)}</i>"
        c = x.contribution
        share = "n/a"
        if c is not None and share_of is not None:
            share = _pct(share_of(c.value))
            if c.low is not None and c.high is not None:
                share += f" [{100 * share_of(c.low):.1f}, {100 * share_of(c.high):.1f}]"
        rows.append(
            [
                label,
                "<br>".join(_e(line.strip()) for line in _levers([x.change], {x.change: x})[1:]),
                _pct(imp),
                _e(_interval(c)) if c is not None else "n/a",
                _e(share),
                _e(_measured(x.without, e.unit)),
            ]
        )
    table = _table(
        [
            "change",
            "baseline -> winner",
            "Optuna importance (share)",
            f"measured contribution {e.unit} (95% interval)",
            "share of the gain",
            "winner without it",
        ],
        rows,
        numeric={2, 3, 4},
    )
    fig = go.Figure()
    labels = [_label([x.change]) for x in effects]
    if importances:
        fig.add_trace(
            go.Bar(
                y=labels,
                x=shares,
                orientation="h",
                name="Optuna importance (share)",
                marker={"color": "#9467bd"},
                hovertext=[
                    f"{_pe(x.change)}<br>importance {_pct(s)}"
                    for x, s in zip(effects, shares, strict=True)
                ],
                hoverinfo="text",
            )
        )
    if share_of is not None:
        values = [share_of(x.contribution.value) if x.contribution else None for x in effects]

        def whisker(high: bool) -> list[float]:
            """How far the interval's bound lies from the bar's end, as a share."""
            out = []
            for x, v in zip(effects, values, strict=True):
                c = x.contribution
                edge = None if c is None else (c.high if high else c.low)
                out.append(0.0 if v is None or edge is None else abs(share_of(edge) - v))
            return out

        fig.add_trace(
            go.Bar(
                y=labels,
                x=values,
                orientation="h",
                name="measured contribution (share of the gain)",
                marker={"color": "#ff7f0e"},
                error_x={
                    "type": "data",
                    "symmetric": False,
                    "array": whisker(high=True),
                    "arrayminus": whisker(high=False),
                },
                hovertext=[
                    f"{_pe(x.change)}<br>contribution {_pe(_interval(x.contribution, e.unit))}"
                    if x.contribution
                    else f"{_pe(x.change)}<br>not measured"
                    for x in effects
                ],
                hoverinfo="text",
            )
        )
    fig.update_layout(
        barmode="group",
        xaxis={"title": "share", "tickformat": ".0%"},
        yaxis={"autorange": "reversed", "type": "category", "automargin": True},
        legend={"orientation": "h", "y": 1.08},
    )
    total = sum(x.contribution.value for x in effects if x.contribution is not None)
    added = (
        f" (here they sum to {_pct(share_of(total))} of the gain)" if share_of is not None else ""
    )
    note = _note(
        "Two estimates of different things. Optuna's importance (PED-ANOVA over the study's "
        "feasible trials, summed over each change's levers) says how much of the variance "
        "of the objective across the trials a parameter explains: a lever can matter across "
        "the search (bad values sink trials) and cost nothing to revert at the winner. A "
        "measured contribution is what reverting the change from the winner costs (the "
        "winner minus the winner without it, both measured from freshly started "
        "processes), as a share of the winner's gain over the baseline; contributions do "
        f"not add up to the gain when changes interact{added}."
    )
    if not importances:
        note += _note(
            "No Optuna importances for this study (too few feasible trials, or they could "
            "not be computed): only the measured contributions are drawn."
        )
    if share_of is None:
        note += _note("The winner does not beat the baseline: no share of the gain to draw.")
    plot = ""
    if fig.data:
        plot = _plot(fig, "plot-explain-importance", height=_rows_height(effects, per=44))
    return head + table + plot + note


def _importance_share(levers: Sequence[str], importances: Mapping[str, float]) -> float | None:
    """A change's importance: its levers' summed (the levers that change together); None
    when Optuna has no figure for any of them."""
    known = [importances[lever] for lever in levers if lever in importances]
    return sum(known) if known else None


def _rows_height(rows: Sequence[object], per: int = 34) -> int:
    return max(460, 140 + per * len(rows))


def _times(x: Interval | None) -> str:
    """A ratio: ``0.974x [0.927, 1.024]``."""
    if x is None:
        return "n/a"
    text = f"{x.value:.3f}x"
    if x.low is not None and x.high is not None:
        text += f" [{x.low:.3f}, {x.high:.3f}]"
    return text


def _ratio_of(a: Measured, b: Measured, sd: float | None, df: int) -> Interval | None:
    """mean(a) / mean(b) with its 95% interval, as the minimal winner's ratio is computed
    (log scale, relative noise ``sd``; :meth:`autotune.explain.Planner.ratio`)."""
    if a.mean is None or b.mean is None or b.mean.value <= 0 or not a.n or not b.n:
        return None
    r = a.mean.value / b.mean.value
    if sd is None or df < 1:
        return Interval(value=r)
    half = t_quantile(0.95, df) * sd * math.sqrt(1.0 / a.n + 1.0 / b.n)
    return Interval(value=r, low=r * math.exp(-half), high=r * math.exp(half))
