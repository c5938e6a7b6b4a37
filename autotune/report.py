"""A self-contained HTML report of a study: one file, plotly.js inlined, no network access.

Everything is read through :mod:`autotune.results` (the stored trial schema). Every value that
comes from the study (configuration, commands, failure reasons) is HTML-escaped; plotly
escapes ``<`` and ``/`` inside its JSON, so a planted ``</script>`` cannot end a script block.
Every trial is redacted again on the way in (:func:`autotune.export.redact_trial`): a study
written before redaction existed, or by other tooling, cannot put a credential in a report
that is meant to be shared.
Sections degrade to a sentence when there is nothing to show (no trials, no feasible trial,
too few trials for importances, no latency-throughput curve). Figures and table heads name
the study's first objective and its unit (:func:`autotune.results.objective_label`).

The curve sections read ``TrialResult.curve``: the best configurations' p99 TTFT and TPOT
against output throughput, and every curve point as tok/s per user (1000 / mean TPOT in ms)
against tok/s per GPU with its Pareto front (:func:`nondominated`). A trial records its
deployment's name, not its GPU count: :func:`deployment_gpus` reads ``gpus:`` from the
deployment file of that name when the report is written, and without one the figures are
per deployment.

The explanation section draws what ``autotune explain`` stored
(:func:`autotune.explain.load_explanation`): a waterfall from the baseline to the winner,
the minimal winner beside the full one, and each change's measured contribution beside
Optuna's importance of its levers; before an explanation it says how to get one.

Why one module of ~1,600 lines: one self-contained HTML file; the figures and the tables
share the escaping rules that keep a planted value from ending a script block.
"""

from __future__ import annotations

import html
import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import optuna
import plotly.graph_objects as go
from optuna.trial import TrialState
from plotly.colors import qualitative
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from autotune.deployment import available_deployments, load_deployment
from autotune.errors import AutotuneError, StorageError
from autotune.explain import Effect, Explanation, Interval, Measured, load_explanation
from autotune.export import redact_trial
from autotune.results import (
    ConfigEstimate,
    Measurement,
    ServiceRecord,
    TrialResult,
    baseline_trial,
    best_estimate,
    config_estimates,
    format_estimate,
    gain_over_baseline,
    load_remeasurements,
    load_results,
    objective_label,
    own_trials,
    t_quantile,
)
from autotune.secrets import redacted_command

PHASES: tuple[str, ...] = ("restart", "probe", "warmup", "measure", "tuner")
PHASE_LABELS = {
    "restart": "restart",
    "probe": "correctness probe",
    "warmup": "warm-up",
    "measure": "measure",
    "tuner": "tuner",
}
MIN_IMPORTANCE_TRIALS = 5
"""Below this many feasible trials importances are noise; the section says so instead."""
TOP_N = 10
CURVE_TOP_N = 5
"""Configurations whose latency-throughput curves are drawn (plus the baseline's)."""

_PLOT_CONFIG = {"displaylogo": False, "responsive": True}
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:1200px;color:#222;padding:0 1em}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #ddd;padding:.3em .6em;
text-align:left;vertical-align:top}th{background:#f4f4f4}td.num{text-align:right;
white-space:nowrap}
pre{white-space:pre-wrap;word-break:break-all;margin:0;font-size:.85em}
pre.cfg{white-space:pre;word-break:normal}
.note{color:#666;font-style:italic}.plot{height:460px}
"""


@dataclass(frozen=True)
class Objective:
    """The study's first objective as the report names it (:func:`objective_label`)."""

    what: str
    unit: str

    @classmethod
    def of(cls, study: optuna.Study) -> Objective:
        what, unit = objective_label(study.metric_names or [])
        return cls(what, unit)

    @property
    def column(self) -> str:
        """A table head: ``output tok/s``, ``capacity req/s``."""
        if self.unit == "tok/s":
            return "output tok/s"
        return f"{self.what} {self.unit}".strip()

    @property
    def axis(self) -> str:
        """An axis title: ``output throughput (tok/s)``."""
        return f"{self.what} ({self.unit})" if self.unit else self.what

    @property
    def title(self) -> str:
        """``Throughput``, ``Capacity``: a section title's first word."""
        return "Throughput" if self.unit == "tok/s" else self.what[:1].upper() + self.what[1:]


THROUGHPUT_OBJECTIVE = Objective("output throughput", "tok/s")


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


# --- sections -----------------------------------------------------------------------------


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


# --- latency-throughput curves and the per-user / per-GPU front -------------------------

NO_CURVE = (
    "No trial recorded a latency-throughput curve (a study's curve: sweep or a capacity "
    "search records one)."
)


def _curves(results: list[TrialResult], baseline: TrialResult | None) -> str:
    """p99 TTFT and p99 TPOT against output throughput along the curves of the best
    :data:`CURVE_TOP_N` distinct feasible configurations that have one (the top table's
    ranking) and the baseline's."""
    head = _section_open("curves", "Latency-throughput curves")
    if not any(_curve(r) for r in results):
        return head + _note(NO_CURVE) + "</section>"
    chosen = _curve_configs(results, baseline)
    if not chosen:
        return (
            head
            + _note("No feasible configuration (nor the baseline) recorded a curve.")
            + "</section>"
        )
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1)
    palette = qualitative.Plotly
    for i, r in enumerate(chosen):
        points = _curve(r)
        at = _capacity_index(r, points)
        name = f"trial {r.number}" + (" (baseline)" if r.is_baseline else "")
        color = palette[i % len(palette)]
        marker = {
            "color": color,
            "symbol": [
                "star" if j == at else ("circle" if p.get("ok") else "circle-open")
                for j, p in enumerate(points)
            ],
            "size": [16 if j == at else 9 for j in range(len(points))],
            "line": {"color": color, "width": 1.5},
        }
        text = [_point_hover(r, p, baseline, capacity=j == at) for j, p in enumerate(points)]
        for col, key in ((1, "ttft_p99"), (2, "tpot_p99")):
            fig.add_trace(
                go.Scatter(
                    x=[_value(p, "output_throughput") for p in points],
                    y=[_value(p, key) for p in points],
                    mode="lines+markers",
                    name=name,
                    legendgroup=name,
                    showlegend=col == 1,
                    line={"color": color},
                    marker=marker,
                    text=text,
                    hoverinfo="text",
                ),
                row=1,
                col=col,
            )
    fig.update_xaxes(title_text="output throughput (tok/s)")
    fig.update_yaxes(title_text="TTFT p99 (ms)", row=1, col=1)
    fig.update_yaxes(title_text="TPOT p99 (ms)", row=1, col=2)
    note = _note(
        f"One line per configuration (the best {CURVE_TOP_N} distinct feasible ones with a "
        "curve, by the first objective, and the baseline), in the order the loads were "
        "swept; filled markers met every SLO, hollow ones broke one, a star is the capacity "
        "a capacity search found. Latencies and throughputs are on the modeled hardware's "
        "clock."
    )
    return head + _plot(fig, "plot-curves") + note + "</section>"


def _curve_configs(results: list[TrialResult], baseline: TrialResult | None) -> list[TrialResult]:
    """The trials whose curves :func:`_curves` draws: the best :data:`CURVE_TOP_N` distinct
    feasible configurations with a curve, then the baseline if it has one and is not
    among them."""
    chosen: list[TrialResult] = []
    seen: set[str] = set()
    for r in _ranked(results):
        key = _config_key(r)
        if not _curve(r) or key in seen:
            continue
        seen.add(key)
        chosen.append(r)
        if len(chosen) == CURVE_TOP_N:
            break
    if baseline is not None and _curve(baseline) and _config_key(baseline) not in seen:
        chosen.append(baseline)
    return chosen


def _interactivity(
    results: list[TrialResult],
    baseline: TrialResult | None,
    gpus: Mapping[str, tuple[int, str]],
) -> str:
    """Every curve point as (tok/s per user, tok/s per GPU), and the points no other beats
    on both: the front as InferenceMAX and NVIDIA draw it."""
    trials = [r for r in results if r.complete and r.reused_from is None and _curve(r)]
    per_gpu = bool(trials) and all((r.deployment or "") in gpus for r in trials)
    unit = "GPU" if per_gpu else "deployment"
    head = _section_open("frontier", f"Pareto front: tok/s per user vs tok/s per {unit}")
    if not trials:
        return head + _note(NO_CURVE) + "</section>"
    rows: list[tuple[float, float, str, bool]] = []  # x, y, hover, met the SLOs
    for r in trials:
        count = gpus[r.deployment or ""][0] if per_gpu else 1
        for p in _curve(r):
            tpot, out = _value(p, "tpot_mean"), _value(p, "output_throughput")
            if tpot is None or tpot <= 0 or out is None or out <= 0:
                continue
            user, share = 1000.0 / tpot, out / count
            lines = [
                f"trial {r.number}",
                _load(r, p),
                f"{user:,.1f} tok/s per user (TPOT mean {tpot:,.1f} ms)",
                f"{share:,.1f} tok/s per {unit}"
                + (f" ({out:,.1f} tok/s on {count} GPUs)" if per_gpu else ""),
                _slo_line(p),
                *_changes(r, baseline),
            ]
            rows.append((user, share, "<br>".join(_e(line) for line in lines), bool(p.get("ok"))))
    if not rows:
        return (
            head
            + _note("No curve point has both a mean TPOT and an output throughput.")
            + "</section>"
        )
    front = nondominated([(row[0], row[1]) for row in rows])
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[row[0] for row in rows],
            y=[row[1] for row in rows],
            mode="markers",
            name="curve points (all configurations)",
            marker={
                "color": "#1f77b4",
                "size": 7,
                "opacity": 0.35,
                "symbol": ["circle" if row[3] else "circle-open" for row in rows],
            },
            text=[row[2] for row in rows],
            hoverinfo="text",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[rows[i][0] for i in front],
            y=[rows[i][1] for i in front],
            mode="lines+markers",
            name="Pareto front",
            line={"color": "#2ca02c"},
            marker={"color": "#2ca02c", "size": 10, "symbol": "diamond"},
            text=[rows[i][2] for i in front],
            hoverinfo="text",
        )
    )
    fig.update_layout(
        xaxis_title="interactivity: tok/s per user (higher is better)",
        yaxis_title=f"output tok/s per {unit} (higher is better)",
    )
    if per_gpu:
        counts = sorted({(r.deployment or "", *gpus[r.deployment or ""]) for r in trials})
        source = (
            "tok/s per GPU = output throughput / the GPUs the deployment occupies (its "
            "file's gpus:, read when this report was written: "
            + "; ".join(f"{name}: {n} from {where}" for name, n, where in counts)
            + ")."
        )
    else:
        unknown = sorted({r.deployment or "(none recorded)" for r in trials} - set(gpus))
        source = (
            "tok/s per deployment = output throughput of the whole deployment: the GPU "
            f"count of {', '.join(unknown)} is unknown (no deployment file of that name "
            "with gpus: was found)."
        )
    note = _note(
        "Each faint marker is one point of a trial's latency-throughput curve; the line "
        "joins the points that no other point beats on both axes (hollow: the point broke "
        "an SLO; the front ignores SLOs). tok/s per user = 1000 / "
        "mean TPOT in ms: the decode speed one user sees (interactivity). " + source
    )
    return head + _plot(fig, "plot-frontier") + note + "</section>"


def nondominated(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point dominates when both coordinates are maximized,
    in increasing x (so decreasing y): a point is dominated by one at least as high on both
    axes and higher on one. Of points equal on both, only the first is kept (one marker per
    place on the line); a point with a non-finite coordinate is never on the front."""
    order = sorted(
        (i for i, (x, y) in enumerate(points) if math.isfinite(x) and math.isfinite(y)),
        key=lambda i: (-points[i][0], -points[i][1], i),
    )
    front: list[int] = []
    highest = -math.inf
    for i in order:  # by x from the right: on the front iff higher than everything so far
        if points[i][1] > highest:
            front.append(i)
            highest = points[i][1]
    return front[::-1]


def deployment_gpus(
    names: Iterable[str], *, search_dirs: Sequence[Path] | None = None
) -> dict[str, tuple[int, str]]:
    """``name -> (GPUs, file)`` for the named deployments whose file sets ``gpus:``.

    A trial records its deployment's name, not its GPU count, so the count is read from
    the deployment file of that ``name:`` (or file name) when the report is written:
    among the files :func:`autotune.deployment.available_deployments` finds
    (``launchers/`` in the working directory first, then the bundled ones; or
    ``search_dirs``). Names without such a file, or whose file does not load or sets no
    ``gpus:``, are left out."""
    wanted = {n for n in names if n}
    found: dict[str, tuple[int, str]] = {}
    if not wanted:
        return found
    for stem, path in available_deployments(search_dirs).items():
        try:
            dep = load_deployment(path)
        except AutotuneError:
            continue
        if dep.gpus is None:
            continue
        for key in {dep.name, stem, path.name} & wanted:
            found.setdefault(key, (dep.gpus, _shown_path(path)))
        if wanted <= set(found):
            break
    return found


def _shown_path(path: Path) -> str:
    """``path`` relative to the working directory, else its name (no home directory in a
    report that is meant to be shared)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path.name


def _curve(r: TrialResult) -> list[Mapping[str, Any]]:
    """The trial's curve points that have an output throughput, in the stored order."""
    return [
        p for p in r.curve if isinstance(p, Mapping) and _value(p, "output_throughput") is not None
    ]


def _capacity_index(r: TrialResult, points: Sequence[Mapping[str, Any]]) -> int | None:
    """Where the capacity a capacity search found lies on its curve (its passing probe)."""
    capacity = _value(r.capacity or {}, "capacity")
    if capacity is None or capacity <= 0:
        return None
    hits = [
        j
        for j, p in enumerate(points)
        if p.get("ok") and (x := _value(p, "x")) is not None and math.isclose(x, capacity)
    ]
    return hits[-1] if hits else None


def _point_hover(
    r: TrialResult, p: Mapping[str, Any], baseline: TrialResult | None, *, capacity: bool
) -> str:
    lines = [
        f"trial {r.number}",
        _load(r, p),
        f"{_num(_value(p, 'output_throughput'))} tok/s",
        f"TTFT p99 {_num(_value(p, 'ttft_p99'))} ms",
        f"TPOT p99 {_num(_value(p, 'tpot_p99'))} ms",
        _slo_line(p),
    ]
    if capacity:
        lines.append("capacity (the highest passing load)")
    lines += _changes(r, baseline)
    return "<br>".join(_e(line) for line in lines)


def _load(r: TrialResult, p: Mapping[str, Any]) -> str:
    """The load a point was measured at: a request rate or a concurrency when the trial
    says which (a capacity search does), else the bare figure."""
    x = _value(p, "x")
    shown = "n/a" if x is None else f"{x:g}"
    over = (r.capacity or {}).get("over")
    if over == "rate":
        return f"rate {shown} req/s"
    if over == "concurrency":
        return f"concurrency {shown}"
    return f"load {shown}"


def _slo_line(p: Mapping[str, Any]) -> str:
    if p.get("ok"):
        return "met the SLOs"
    broke = [str(v) for v in p.get("violations") or []]
    return "broke: " + ("; ".join(broke) if broke else "an SLO")


def _changes(r: TrialResult, baseline: TrialResult | None, limit: int = 8) -> list[str]:
    """Hover lines: the levers whose values differ from the baseline's configuration."""
    if baseline is None:
        return []
    if r.number == baseline.number:
        return ["the baseline"]
    missing = object()
    keys = sorted(set(r.config) | set(baseline.config))
    diff = [
        f"  {k} = {r.config[k]}" if k in r.config else f"  {k}: inactive"
        for k in keys
        if r.config.get(k, missing) != baseline.config.get(k, missing)
    ]
    if not diff:
        return ["same configuration as the baseline"]
    more = [f"  ... {len(diff) - limit} more"] if len(diff) > limit else []
    return ["changed vs baseline:", *diff[:limit], *more]


def _config_key(r: TrialResult) -> str:
    return json.dumps(r.config, sort_keys=True, default=str) if r.config else f"#{r.number}"


def _value(point: Mapping[str, Any], key: str) -> float | None:
    value = point.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


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


# --- the explanation (autotune explain) ----------------------------------------------------

NO_EXPLANATION = (
    "No explanation yet: `autotune explain --study {study}` measures what each of the "
    "winner's changes from the baseline bought (each reverted alone, from freshly started "
    "services), the path from the baseline and the minimal winner."
)


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


def _rows_height(rows: Sequence[object], per: int = 34) -> int:
    return max(460, 140 + per * len(rows))


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
                f'<pre class="cfg">{_e(config)}</pre>',
                f"<pre>{_e(commands)}</pre>",
            ]
        )
    table = _table(
        ["#", "trial", objective.column, "TPOT p99 ms", "gain", "config", "commands"],
        rows,
        numeric={2, 3, 4},
    )
    return head + table + "</section>"


# --- helpers ------------------------------------------------------------------------------
def _command(rec: ServiceRecord) -> str:
    """The stored (redacted) command, else one rebuilt from the record."""
    return rec.command or redacted_command(rec.argv, rec.env, rec.unset_env)


def _front(points: Iterable[TrialResult]) -> list[TrialResult]:
    """Non-dominated (max throughput, min TPOT) points, sorted by throughput."""
    pts = [r for r in points if r.throughput is not None and r.tpot_p99_ms is not None]
    front = [
        r
        for r in pts
        if not any(
            (o.throughput or 0) >= (r.throughput or 0)
            and (o.tpot_p99_ms or 0) <= (r.tpot_p99_ms or 0)
            and (
                (o.throughput or 0) > (r.throughput or 0)
                or (o.tpot_p99_ms or 0) < (r.tpot_p99_ms or 0)
            )
            for o in pts
        )
    ]
    return sorted(front, key=lambda r: (r.throughput or 0.0, r.number))


def _ranked(results: Iterable[TrialResult]) -> list[TrialResult]:
    """Feasible, fully measured trials by the first objective (best first), as the top
    table ranks them."""
    return sorted(
        (r for r in results if r.feasible and r.throughput is not None and r.aborted is None),
        key=lambda r: (-(r.throughput or 0.0), r.number),
    )


def _hover(r: TrialResult, unit: str = "tok/s") -> str:
    lines = [
        f"trial {r.number}",
        f"{_num(r.throughput)} {unit}".rstrip(),
        f"TPOT p99 {_num(r.tpot_p99_ms)} ms",
    ]
    if r.failure:
        lines.append(f"failure: {r.failure}")
    elif not r.feasible:
        violated = [k for k, v in r.constraints.items() if v > 0 and not k.isdigit()]
        lines.append("violated: " + ", ".join(violated))
    return "<br>".join(_e(line) for line in lines)


def _plot(fig: go.Figure, div_id: str, *, height: int | None = None) -> str:
    """``height``: pixels, for a plot with one row per item (the default fits the rest)."""
    fig.update_layout(template="plotly_white", margin={"l": 60, "r": 20, "t": 30, "b": 50})
    inner = fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=_PLOT_CONFIG)
    style = f' style="height:{height}px"' if height else ""
    return f'<div class="plot"{style}>{inner}</div>'


def _section_open(anchor: str, title: str) -> str:
    return f'<section id="{anchor}">\n<h2>{_e(title)}</h2>\n'


def _kv_table(rows: Sequence[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], *, numeric: set[int]) -> str:
    """``head`` is plain text (escaped here); cells are HTML already escaped by the caller."""
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _note(text: str) -> str:
    return f'<p class="note">{_e(text)}</p>'


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _pe(text: object) -> str:
    """Escaped for plotly's text (labels, hovers): ``&``, ``<``, ``>`` only. Plotly decodes
    these, but not ``&quot;`` or ``&#x27;``, which it would show as such; the figure's JSON
    needs no more (plotly escapes ``<`` and ``/`` there)."""
    return html.escape(str(text), quote=False)


def _num(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f} %"


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.2f}x"
