"""What every section of the report shares: the page's style, the escaping rules, the
table and plot helpers, the study's first objective as the report names it, and the
ranking of the top trials.

The escaping lives here once: every value that comes from the study (configuration,
commands, failure reasons) goes through :func:`_e` for HTML or :func:`_pe` for plotly's
text, so a planted ``</script>`` cannot end a script block in any section.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import optuna
import plotly.graph_objects as go

from autotune.results import (
    ServiceRecord,
    TrialResult,
    objective_label,
)
from autotune.secrets import redacted_command

TOP_N = 10


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


INFEASIBLE_MARKER = {"color": "#d62728", "symbol": "x"}


def _feasibility_traces(
    fig: go.Figure,
    rows: Sequence[TrialResult],
    xy: Callable[[TrialResult], tuple[object, object]],
    unit: str,
    *,
    feasible: tuple[str, dict[str, object] | None] = ("feasible", None),
    infeasible: str = "infeasible",
) -> list[TrialResult]:
    """The trials as two marker traces, feasible and infeasible (a red x), each with the trial's
    hover text, as every scatter of the report draws them; returns the feasible ones."""
    ok = [r for r in rows if r.feasible]
    groups = (
        (ok, *feasible),
        ([r for r in rows if not r.feasible], infeasible, INFEASIBLE_MARKER),
    )
    for group, name, marker in groups:
        if group:
            points = [xy(r) for r in group]
            fig.add_trace(
                go.Scatter(
                    x=[x for x, _ in points],
                    y=[y for _, y in points],
                    mode="markers",
                    name=name,
                    marker=marker,
                    text=[_hover(r, unit) for r in group],
                    hoverinfo="text",
                )
            )
    return ok


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
