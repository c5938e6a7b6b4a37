"""Where a trial's time goes, by phase (shown when trials recorded their phase times):
restart, the correctness probe, warm-up, measure and the tuner's own time, and what
early aborts and re-measurements took.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from autotune.launch import ServiceStartup
from autotune.report._common import _e, _num, _pct, _plot, _section_open, _table
from autotune.report._data import ReportData

PHASES: tuple[str, ...] = ("restart", "probe", "warmup", "measure", "tuner")


PHASE_LABELS = {
    "restart": "restart",
    "probe": "correctness probe",
    "warmup": "warm-up",
    "measure": "measure",
    "tuner": "tuner",
}


def section(data: ReportData) -> str | None:
    """Where a trial's time goes: per trial (stacked bars) and over the study (median, mean,
    total and share of each phase). ``tuner`` is the loop's own time (sampler, storage,
    journal, rendering, the load generator's set-up); the correctness probe is a request
    the deployment serves, shown as its own phase."""
    results, remeasured = data.results, data.remeasured
    timed = [r for r in results if r.phase_seconds]
    if not timed:
        return None
    head = _section_open("time", "Time per trial")
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
    startup = _startup(
        # a reused trial started nothing (its record may hold a copy of the original's
        # stages: reused trials copied them until they were dropped from the copy)
        [(f"#{r.number}", r.startup) for r in timed if r.reused_from is None]
        + [(f"#{m.of}, re-measure {m.repeat}", m.startup) for m in remeasured]
    )
    return head + _plot(fig, "plot-time") + table + summary + startup + "</section>"


def _startup(starts: Sequence[tuple[str, Mapping[str, ServiceStartup]]]) -> str:
    """Where the restarts went, stage by stage (the stage lines each engine prints while it
    starts: :mod:`autotune.launch.startup`), with the start that spent the most in each: a
    stage that costs much more in some configurations (torch.compile, CUDA-graph capture)
    is a cost of those settings, which the study's time budget pays at every restart.
    ``starts``: (label, the services' start-up) per trial and per re-measurement."""
    # service -> stage -> (seconds, start), stages in the order the starts entered them
    spans: dict[str, dict[str, list[tuple[float, str]]]] = {}
    healthy: dict[str, list[tuple[float, str]]] = {}
    for label, startup in starts:
        for service, st in startup.items():
            for stage, seconds in st.spans():
                spans.setdefault(service, {}).setdefault(stage, []).append((seconds, label))
            if st.ready_s is not None:
                healthy.setdefault(service, []).append((st.ready_s, label))
    if not any(st.stages for _, startup in starts for st in startup.values()):
        return ""

    def row(service: str, label: str, values: list[tuple[float, str]]) -> list[str]:
        longest, start = max(values)
        median = _median([v for v, _ in values])
        return [
            _e(service),
            label,
            str(len(values)),
            _num(median, 1),
            f"{_num(longest, 1)} ({_e(start)})",
        ]

    rows = []
    for service, stages in spans.items():
        rows += [row(service, _e(stage), values) for stage, values in stages.items()]
        if service in healthy:
            rows.append(row(service, "<b>start to healthy</b>", healthy[service]))
    table = _table(
        ["service", "start-up stage", "starts", "median s", "longest s (start)"],
        rows,
        numeric={2, 3, 4},
    )
    return (
        "<h3>Start-up, by stage</h3><p>From each stage line the engine printed while it "
        "started to the next (the first stage from the process start, the last until the "
        "server answered; failed starts until they failed), as the launcher read the log. "
        "Stages of the configurations that failed count too, and the re-measurements' "
        "fresh starts.</p>" + table
    )


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
