"""The report's tables: time per trial by phase, noise and re-measurement, failure
classes, and the top trials with their configurations and commands.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from autotune.report._common import (
    THROUGHPUT_OBJECTIVE,
    TOP_N,
    Objective,
    _command,
    _e,
    _note,
    _num,
    _pct,
    _plot,
    _ranked,
    _ratio,
    _section_open,
    _table,
)
from autotune.report.telemetry import top_columns
from autotune.results import (
    ConfigEstimate,
    Measurement,
    TrialResult,
    gain_over_baseline,
)

PHASES: tuple[str, ...] = ("restart", "probe", "warmup", "measure", "tuner")


PHASE_LABELS = {
    "restart": "restart",
    "probe": "correctness probe",
    "warmup": "warm-up",
    "measure": "measure",
    "tuner": "tuner",
}


def _time_breakdown(results: list[TrialResult], remeasured: Sequence[Measurement] = ()) -> str:
    """Where a trial's time goes: per trial (stacked bars) and over the study (median, mean,
    total and share of each phase). ``tuner`` is the loop's own time (sampler, storage,
    journal, rendering, the load generator's set-up); the correctness probe is a request
    the deployment serves, shown as its own phase."""
    head = _section_open("time", "Time per trial")
    timed = [r for r in results if r.phase_seconds]
    if not timed:
        return head + _note("No trial recorded phase times.") + "</section>"
    phases = [p for p in PHASES if p != "probe" or any(p in r.phase_seconds for r in timed)]
    fig = go.Figure()
    for phase in phases:
        fig.add_trace(
            go.Bar(
                x=[r.number for r in timed],
                y=[r.phase_seconds.get(phase, 0.0) for r in timed],
                name=PHASE_LABELS[phase],
            )
        )
    fig.update_layout(barmode="stack", xaxis_title="trial", yaxis_title="seconds")
    per_phase = {p: [r.phase_seconds.get(p, 0.0) for r in timed] for p in phases}
    totals = {p: sum(v) for p, v in per_phase.items()}
    grand = sum(totals.values())
    per_trial = [sum(r.phase_seconds.get(p, 0.0) for p in phases) for r in timed]
    rows = [
        [
            _e(PHASE_LABELS[p]),
            _num(_median(per_phase[p]), 2),
            _num(totals[p] / len(timed), 2),
            _num(totals[p]),
            _pct(totals[p] / grand if grand else None),
        ]
        for p in phases
    ]
    rows.append(
        [
            "<b>all</b>",
            _num(_median(per_trial), 2),
            _num(grand / len(timed), 2),
            _num(grand),
            _pct(1.0),
        ]
    )
    table = _table(
        ["phase", "median s / trial", "mean s / trial", "total s", "share"],
        rows,
        numeric={1, 2, 3, 4},
    )
    overhead = totals["tuner"] / grand if grand else None
    summary = (
        f"<p>Tuner overhead: <b>{_pct(overhead)}</b> of recorded time "
        f"(median {_num(_median(per_phase['tuner']) * 1000, 0)} ms per trial: sampling, "
        "rendering, the journal and storage writes, the load generator's set-up; the "
        "correctness probe is a request the deployment serves, shown on its own).</p>"
    )
    aborted = [r.phase_seconds.get("measure", 0.0) for r in timed if r.aborted]
    full = [
        r.phase_seconds.get("measure", 0.0)
        for r in timed
        if not r.aborted and r.phase_seconds.get("measure", 0.0) > 0
    ]
    if aborted:
        summary += (
            f"<p>{len(aborted)} trial(s) aborted early (clearly below the incumbent): measure "
            f"phase median {_num(_median(aborted), 2)} s against {_num(_median(full), 2)} s "
            "for the fully measured ones.</p>"
        )
    if remeasured:
        spent = sum(sum(m.phase_seconds.get(p, 0.0) for p in PHASES) for m in remeasured)
        summary += (
            f"<p>Re-measurement: {len(remeasured)} run(s), {_num(spent)} s "
            f"({_pct(spent / (grand + spent) if grand + spent else None)} of all recorded time; "
            "not in the table above).</p>"
        )
    return head + _plot(fig, "plot-time") + table + summary + "</section>"


def _noise(
    estimates: Sequence[ConfigEstimate],
    winner: ConfigEstimate | None,
    objective: Objective = THROUGHPUT_OBJECTIVE,
) -> str:
    """The best configurations with every measurement, mean +- 95% CI and the lower bound
    the winner is picked by."""
    head = _section_open("noise", "Noise and re-measurement")
    eligible = [e for e in estimates if e.n > 0]
    if not eligible:
        return head + _note("No fully measured feasible trial.") + "</section>"
    sd, df = eligible[0].noise_sd, eligible[0].noise_df
    if sd is None:
        intro = _note(
            "No configuration was measured twice yet: confidence intervals are unknown and "
            "configurations are ranked by their single measurement."
        )
    else:
        intro = (
            f"<p>Run-to-run noise: <b>{sd * 100:.1f} %</b> (relative standard deviation "
            f"pooled over the configurations measured more than once, {df} degrees of "
            "freedom). Configurations are ranked by the lower bound of their 95% confidence "
            "interval.</p>"
        )
    ranked = sorted(eligible, key=lambda e: (-e.lower, -e.mean, e.trial.number))[:TOP_N]
    rows = []
    for e in ranked:
        runs = "; ".join(
            (f"#{m.of}" if m.repeat == 0 else f"re-run {m.repeat}")
            + ": "
            + (
                f"{m.throughput:,.1f}"
                if m.full and m.throughput is not None
                else ("aborted" if m.aborted else str(m.failure or "infeasible"))
            )
            for m in e.measurements
        )
        mark = " (winner)" if winner is not None and e.trial.number == winner.trial.number else ""
        rows.append(
            [
                _e(f"{e.trial.number}{mark}"),
                str(e.n),
                _num(e.mean),
                "n/a" if e.half_width is None else f"&plusmn; {_num(e.half_width)}",
                _num(e.lower),
                _e(runs) + (f"<br><i>{_e(e.flaky)}</i>" if e.flaky else ""),
            ]
        )
    table = _table(
        [
            "trial",
            "n",
            f"mean {objective.unit or objective.what}",
            "95% CI",
            "lower bound",
            f"measurements ({objective.unit or objective.what})",
        ],
        rows,
        numeric={1, 2, 3, 4},
    )
    return head + intro + table + "</section>"


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _failures(results: list[TrialResult]) -> str:
    head = _section_open("failures", "Failure classes")
    failed = [r for r in results if r.failure]
    slo = [r for r in results if r.complete and not r.failure and not r.feasible]
    if not failed and not slo:
        return head + _note("No failed or infeasible trial.") + "</section>"
    by_class: dict[str, list[TrialResult]] = {}
    for r in failed:
        by_class.setdefault(str(r.failure), []).append(r)
    rows = [
        [
            _e(name),
            str(len(group)),
            _e(", ".join(str(r.number) for r in group[:10]) + (" ..." if len(group) > 10 else "")),
            f"<pre>{_e(group[0].reason)}</pre>",
        ]
        for name, group in sorted(by_class.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    ]
    if slo:
        rows.append(
            [
                "constraint violated (measured)",
                str(len(slo)),
                _e(", ".join(str(r.number) for r in slo[:10])),
                "",
            ]
        )
    table = _table(["class", "count", "trials", "first reason"], rows, numeric={1})
    return head + table + "</section>"


def _top_table(
    results: list[TrialResult],
    baseline: TrialResult | None,
    objective: Objective = THROUGHPUT_OBJECTIVE,
) -> str:
    head = _section_open("top", f"Top {TOP_N} feasible trials")
    ranked = _ranked(results)[:TOP_N]
    if not ranked:
        return head + _note("No feasible trial.") + "</section>"
    gpu_heads, gpu_cells = top_columns(ranked)
    rows = []
    for rank, r in enumerate(ranked, 1):
        config = "\n".join(f"{k} = {v}" for k, v in sorted(r.config.items()))
        commands = "\n\n".join(f"# {name}\n{_command(rec)}" for name, rec in r.services.items())
        rows.append(
            [
                str(rank),
                str(r.number) + (" (baseline)" if r.is_baseline else ""),
                _num(r.throughput),
                _num(r.tpot_p99_ms),
                _ratio(gain_over_baseline(r, baseline)),
                *gpu_cells[rank - 1],
                f'<pre class="cfg">{_e(config)}</pre>',
                f"<pre>{_e(commands)}</pre>",
            ]
        )
    table = _table(
        ["#", "trial", objective.column, "TPOT p99 ms", "gain", *gpu_heads, "config", "commands"],
        rows,
        numeric={2, 3, 4, *range(5, 5 + len(gpu_heads))},
    )
    return head + table + "</section>"
