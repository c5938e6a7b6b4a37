"""The page: :func:`write_report` reads the study once and puts the sections together in
their order, the summary first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import optuna
from plotly.offline import get_plotlyjs

from autotune.export import redact_trial
from autotune.report._common import (
    _CSS,
    THROUGHPUT_OBJECTIVE,
    Objective,
    _e,
    _kv_table,
    _note,
    _num,
    _ratio,
    _section_open,
    _table,
)
from autotune.report.curves import _curve, _curves, _interactivity, deployment_gpus
from autotune.report.explanation import _explanation
from autotune.report.search import (
    _history,
    _importance,
    _importance_trials,
    _pareto,
    param_importances,
)
from autotune.report.tables import _failures, _noise, _time_breakdown, _top_table
from autotune.report.telemetry import summary_rows
from autotune.results import (
    ConfigEstimate,
    TrialResult,
    baseline_trial,
    best_estimate,
    config_estimates,
    format_estimate,
    gain_over_baseline,
    load_remeasurements,
    load_results,
)


def write_report(
    study: optuna.Study, *, path: Path, deployment_dirs: Sequence[Path] | None = None
) -> Path:
    """Render ``study`` into one HTML file at ``path`` (parent directories created).

    ``deployment_dirs``: where the deployment files are looked up by the trials'
    deployment names for their GPU count (:func:`deployment_gpus`; default: ``launchers/``
    in the working directory, then the bundled ones)."""
    results = [redact_trial(r) for r in load_results(study)]
    winner, baseline = best_estimate(study), baseline_trial(study)
    best = redact_trial(winner.trial) if winner is not None else None
    baseline = redact_trial(baseline) if baseline is not None else None
    estimates = config_estimates(study)
    remeasured = load_remeasurements(study)
    objective = Objective.of(study)
    with_curves = [r for r in results if _curve(r)]
    gpus = (
        deployment_gpus({r.deployment or "" for r in with_curves}, search_dirs=deployment_dirs)
        if with_curves
        else {}
    )
    importances = param_importances(study) if _importance_trials(results) else {}
    sections = [
        _summary(study, results, best, baseline, winner, objective),
        _pareto(results, best, baseline, objective),
        _curves(results, baseline),
        _interactivity(results, baseline, gpus),
        _history(results, objective),
        _importance(results, importances, objective),
        _explanation(study, importances, winner),
        _noise(estimates, winner, objective),
        _time_breakdown(results, remeasured),
        _failures(results),
        _top_table(results, baseline, objective),
    ]
    title = f"autotune report: {study.study_name}"
    doc = (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{_e(title)}</title>\n<style>{_CSS}</style>\n"
        f'<script type="text/javascript">{get_plotlyjs()}</script>\n</head>\n<body>\n'
        f"<h1>{_e(title)}</h1>\n"
        f'<p class="note">generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}</p>\n'
        + "\n".join(sections)
        + "\n</body>\n</html>\n"
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc, encoding="utf-8")
    return path


def _summary(
    study: optuna.Study,
    results: list[TrialResult],
    best: TrialResult | None,
    baseline: TrialResult | None,
    winner: ConfigEstimate | None = None,
    objective: Objective = THROUGHPUT_OBJECTIVE,
) -> str:
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
