"""The summary (always shown): the study, its objectives and trial counts, the winner with
all its measurements, its GPUs, the fleet plan's cheapest configuration when one was asked
for, and the baseline beside the best.
"""

from __future__ import annotations

from collections import Counter

from autotune.report._common import _e, _kv_table, _note, _num, _ratio, _section_open, _table
from autotune.report._data import ReportData
from autotune.report.telemetry import summary_rows
from autotune.results import (
    TrialResult,
    cards_text,
    format_estimate,
    gain_over_baseline,
    study_cards,
)


def section(data: ReportData) -> str:
    study, results, objective = data.study, data.results, data.objective
    best, baseline, winner = data.best, data.baseline, data.winner
    states = Counter(r.state for r in results)
    names = study.metric_names or ["output_throughput_tok_s"]
    objectives = ", ".join(
        f"{n} ({d.name.lower()})" for n, d in zip(names, study.directions, strict=False)
    )
    deployments = sorted({r.deployment for r in results if r.deployment})
    rows = [
        ("study", study.study_name),
        ("objectives", objectives),
        ("deployment", ", ".join(deployments) or "n/a"),
        ("trials", str(len(results))),
        ("by state", ", ".join(f"{k}: {v}" for k, v in sorted(states.items())) or "none"),
        ("feasible", str(sum(r.feasible for r in results))),
        ("aborted early", str(sum(r.aborted is not None for r in results))),
    ]
    if winner is not None:
        rows.append(("winner (all its measurements)", format_estimate(winner, objective.unit)))
    rows += summary_rows(best)
    # a study resumed on another kind of card (autotune/study/cards.py): its ranking mixes them
    cards = study_cards(data.study, data.estimates)
    across = cards_text(cards, [m.card for m in winner.measurements] if winner else [])
    if across is not None:
        rows.append(("GPU kinds", across))
    cheapest = data.plan.cheapest if data.plan is not None else None
    if data.plan is not None and cheapest is not None:
        s = data.plan.settings
        text = f"{cheapest.label} (trial {cheapest.trial}): {cheapest.replicas} replica(s)"
        if cheapest.gpus is not None:
            text += f", {cheapest.gpus} GPUs"
        if cheapest.cost_per_hour is not None:
            text += f", {cheapest.cost_per_hour:,.2f} per hour"
        rows.append((f"cheapest fleet for {s.target_rate:g} req/s + {100 * s.headroom:g}%", text))
    parts = [_section_open("summary", "Summary"), _kv_table(rows)]
    compare: list[tuple[str, TrialResult]] = []
    if baseline is not None:
        compare.append(("baseline", baseline))
    if best is not None:
        compare.append(("best", best))
    if compare:
        head = ["", "trial", "feasible", objective.column, "TPOT p99 ms", "gain vs baseline"]
        body = []
        for label, r in compare:
            gain = gain_over_baseline(r, baseline) if label == "best" else None
            body.append(
                [
                    _e(label),
                    str(r.number),
                    "yes" if r.feasible else "no",
                    _num(r.throughput),
                    _num(r.tpot_p99_ms),
                    _ratio(gain) if label == "best" else "",
                ]
            )
        parts.append(_table(head, body, numeric={3, 4, 5}))
    if best is None:
        parts.append(_note("No feasible trial: nothing to deploy yet."))
    if baseline is None:
        parts.append(_note("No baseline trial (user attribute is_baseline) in this study."))
    parts.append("</section>")
    return "\n".join(parts)
