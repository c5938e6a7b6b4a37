"""The latency-throughput curves of the best configurations and the front of tok/s per
user against tok/s per GPU (:func:`nondominated`).

A trial records its deployment's name, not its GPU count: :func:`deployment_gpus` reads
``gpus:`` from the deployment file of that name when the report is written, and without
one the figures are per deployment.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from autotune.deployment import available_deployments, load_deployment
from autotune.errors import AutotuneError
from autotune.report._common import _e, _note, _num, _plot, _ranked, _section_open
from autotune.results import (
    TrialResult,
)

CURVE_TOP_N = 5
"""Configurations whose latency-throughput curves are drawn (plus the baseline's)."""


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
