"""The report's explanation section (shown when ``autotune explain`` stored one, and placed
right after the summary: what each change bought is the answer a reader wants first): the
waterfall from the baseline to the winner (:mod:`autotune.report.waterfall`) and the minimal
winner beside the full one. Each change's measured contribution is also drawn beside
Optuna's importance of its levers, in the importance section
(:mod:`autotune.report.importance`), which answers another question.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from autotune.explain import Explanation, GpuBlocks, Interval, Measured
from autotune.explain.occasions import describe
from autotune.report._common import _e, _note, _plot, _section_open, _table
from autotune.report._data import ReportData
from autotune.report.waterfall import (
    _measured,
    _signed,
    waterfall_bars,
    waterfall_figure,
)
from autotune.results import (
    ConfigEstimate,
    t_quantile,
)


def section(data: ReportData) -> str | None:
    """What ``autotune explain`` measured (:class:`autotune.explain.Explanation`): the
    waterfall from the baseline to the winner and the minimal winner beside the full one."""
    title = "Explanation: what each change bought"
    if data.explanation_error is not None:
        return (
            _section_open("explanation", title)
            + _note(f"The stored explanation cannot be read: {data.explanation_error}")
            + "</section>"
        )
    e = data.explanation
    if e is None:
        return None
    parts = [_section_open("explanation", title), _explanation_intro(e, data.name, data.winner)]
    if (blocks := data.explanation_blocks) is not None and e.effects:
        parts.append(_note(_blocks_note(e, blocks)))
    if not e.effects:
        parts.append(_note(f"Trial #{e.winner} has the baseline's configuration: no change."))
        return "\n".join(parts) + "</section>"
    bars = waterfall_bars(e)
    if bars is None:
        parts.append(_note("The winner or the baseline has no measurement: no waterfall."))
    else:
        parts.append(_plot(waterfall_figure(bars, e), "plot-explain", height=rows_height(bars)))
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
    parts.append(_minimal(e, data.name))
    if data.importances:
        parts.append(
            _note(
                "Optuna's parameter importances (further down) answer another question: where "
                "the trials varied, not what a change is worth at the winner; that section "
                "puts each lever's measured contribution from this explanation beside its "
                "importance."
            )
        )
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
        f"{_e(noise)}. {e.runs} run(s)"
        + _borrowed(e.borrowed, e.borrowed_own)
        + ", each from freshly started services, "
        f"{len(e.effects)} change(s) from the baseline.</p>"
    )
    notes = []
    if not e.complete:
        why = e.stopped or "not finished"
        if why == "in progress":  # stored after each run and decision; the process may be gone
            why = "in progress, or interrupted"
        notes.append(
            f"This explanation is incomplete (stopped: {why}): what is shown is what was "
            f"measured so far; `autotune explain --study {study_name}` resumes it."
        )
    notes.extend(_capital(describe(o)) + "." for o in e.occasions)
    if winner is not None and winner.trial.number != e.winner:
        notes.append(
            f"The study's winner is now trial #{winner.trial.number}: this explains trial "
            f"#{e.winner}; `autotune explain --study {study_name}` explains the new one."
        )
    return text + "".join(_note(n) for n in notes)


def _blocks_note(e: Explanation, blocks: GpuBlocks) -> str:
    """Each change's share again, its runs on several GPUs read with the GPU as a block
    (:mod:`autotune.explain.blocks`)."""

    shares = "; ".join(f"{x.change} {blocks.share_text(x.change)}" for x in e.effects)
    return (
        f"The runs span GPUs; {blocks.describe()}. Each change's share of the winner read "
        f"that way (95% intervals): {shares}."
    )


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _borrowed(borrowed: int, own: int) -> str:
    """Where the borrowed runs came from (:mod:`autotune.explain.borrowed`)."""
    others = borrowed - own
    parts = [f"{others} borrowed from another study"] if others else []
    if own:
        parts.append(f"{own} borrowed from the study's own trials (not the winner's)")
    return "".join(f" and {p}" for p in parts)


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


def rows_height(rows: Sequence[object], per: int = 34) -> int:
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
