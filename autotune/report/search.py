"""What the search did: the Pareto front of the first objective against TPOT p99, the
optimization history, and Optuna's parameter importances over the feasible trials.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import optuna
import plotly.graph_objects as go
from optuna.trial import TrialState

from autotune.report._common import (
    THROUGHPUT_OBJECTIVE,
    Objective,
    _front,
    _hover,
    _note,
    _plot,
    _section_open,
)
from autotune.results import (
    TrialResult,
    own_trials,
)

MIN_IMPORTANCE_TRIALS = 5
"""Below this many feasible trials importances are noise; the section says so instead."""


def _pareto(
    results: list[TrialResult],
    best: TrialResult | None,
    baseline: TrialResult | None,
    objective: Objective = THROUGHPUT_OBJECTIVE,
) -> str:
    head = _section_open("pareto", f"{objective.title} vs TPOT p99 (Pareto front)")
    points = [r for r in results if r.measured and r.tpot_p99_ms is not None]
    if not points:
        return head + _note("No measured trial with throughput and TPOT p99 yet.") + "</section>"
    fig = go.Figure()
    feasible = [r for r in points if r.feasible]
    infeasible = [r for r in points if not r.feasible]
    for group, name, marker in (
        (feasible, "feasible", {"color": "#1f77b4", "size": 9}),
        (infeasible, "infeasible (constraint violated)", {"color": "#d62728", "symbol": "x"}),
    ):
        if group:
            fig.add_trace(
                go.Scatter(
                    x=[r.throughput for r in group],
                    y=[r.tpot_p99_ms for r in group],
                    mode="markers",
                    name=name,
                    marker=marker,
                    text=[_hover(r, objective.unit) for r in group],
                    hoverinfo="text",
                )
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
    skipped = len([r for r in results if r.complete]) - len(points)
    extra = _note(f"{skipped} trial(s) without a measurement (failed) are not plotted.")
    return head + _plot(fig, "plot-pareto") + (extra if skipped > 0 else "") + "</section>"


def _history(results: list[TrialResult], objective: Objective = THROUGHPUT_OBJECTIVE) -> str:
    head = _section_open("history", "Optimization history")
    done = [r for r in results if r.complete and r.throughput is not None]
    if not done:
        return head + _note("No completed trial yet.") + "</section>"
    fig = go.Figure()
    feasible = [r for r in done if r.feasible]
    infeasible = [r for r in done if not r.feasible]
    if feasible:
        fig.add_trace(
            go.Scatter(
                x=[r.number for r in feasible],
                y=[r.throughput for r in feasible],
                mode="markers",
                name="feasible",
                text=[_hover(r, objective.unit) for r in feasible],
                hoverinfo="text",
            )
        )
    if infeasible:
        fig.add_trace(
            go.Scatter(
                x=[r.number for r in infeasible],
                y=[r.throughput for r in infeasible],
                mode="markers",
                name="infeasible",
                marker={"color": "#d62728", "symbol": "x"},
                text=[_hover(r, objective.unit) for r in infeasible],
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


def _importance_trials(results: Sequence[TrialResult]) -> int:
    """Feasible trials with parameters; 0 below :data:`MIN_IMPORTANCE_TRIALS` (too few for
    importances that mean anything)."""
    n = sum(1 for r in results if r.feasible and r.throughput is not None and r.params)
    return n if n >= MIN_IMPORTANCE_TRIALS else 0


def _importance(
    results: list[TrialResult],
    importances: Mapping[str, float],
    objective: Objective = THROUGHPUT_OBJECTIVE,
) -> str:
    """``importances``: :func:`param_importances`, computed once (the explanation section
    reads them too)."""
    head = _section_open("importance", "Parameter importances (feasible trials)")
    if not _importance_trials(results):
        usable = [r for r in results if r.feasible and r.throughput is not None and r.params]
        return (
            head
            + _note(
                f"Needs at least {MIN_IMPORTANCE_TRIALS} feasible completed trials "
                f"({len(usable)} so far)."
            )
            + "</section>"
        )
    if not importances:
        return head + _note("Importances could not be computed for these trials.") + "</section>"
    names = list(importances)[::-1]
    fig = go.Figure(
        go.Bar(x=[importances[n] for n in names], y=names, orientation="h", name="importance")
    )
    fig.update_layout(xaxis_title=f"importance for {objective.what} (PED-ANOVA)")
    return head + _plot(fig, "plot-importance") + "</section>"


def param_importances(study: optuna.Study) -> dict[str, float]:
    """Optuna's default evaluator on throughput of the feasible trials ({} if it cannot).

    The feasible trials are copied (with their real distributions) into an in-memory
    single-objective study, so that infeasible trials and a second objective stay out.
    """
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "new study created" line
    try:
        copy = optuna.create_study(direction="maximize")
    finally:
        optuna.logging.set_verbosity(verbosity)
    for trial in own_trials(study, states=(TrialState.COMPLETE,)):
        result = TrialResult.from_frozen(trial, metric_names=study.metric_names)
        if not result.feasible or result.throughput is None or not trial.params:
            continue
        copy.add_trial(
            optuna.trial.create_trial(
                params=trial.params, distributions=trial.distributions, value=result.throughput
            )
        )
    if len(copy.trials) < MIN_IMPORTANCE_TRIALS:
        return {}
    try:
        return dict(optuna.importance.get_param_importances(copy))
    except (ValueError, RuntimeError, ZeroDivisionError):
        return {}
