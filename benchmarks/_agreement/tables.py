"""The report's Markdown tables."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from .constants import LABELS, PAIRS, TOOLS
from .figures import FIGURES, Row, Run

CROSS = (
    ("vllm", "output_tok_s_first_send_last_end",
     "vllm: output tok/s, duration = first send to last end (autotune's)"),
    ("vllm", "itl_p50_text_chunks", "vllm: ITL p50 ms, gaps between text chunks only (autotune's)"),
    ("vllm", "itl_mean_text_chunks",
     "vllm: ITL mean ms, gaps between text chunks only (autotune's)"),
    ("autotune", "itl_mean_vllm",
     "autotune: ITL mean ms, + the gap to the end of the stream (vLLM's)"),
    ("autotune", "e2e_p50_last_text", "autotune: E2E p50 ms, end = last text chunk (AIPerf's)"),
)  # fmt: skip
"""(tool, key, label): one tool's raw data under another tool's definition."""


# ------------------------------------------------------------------------ report


def _fmt(value: float | None, key: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if "tok_s" in key:
        return f"{value:,.1f}"
    return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.1f}"


def _pctf(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.2f}%"


def _sd(value: float | None) -> str:
    return "" if value is None else f" (SD {100 * value:.1f}%)"


def table(rows: Sequence[Row]) -> str:
    """Markdown: per arm its mean (SD over rounds); per pair the difference of the means and,
    after the slash, the mean |difference| within a round."""
    tools = [t for t in TOOLS if any(t in r.means for r in rows)]
    pairs = [(a, b) for a, b in PAIRS if a in tools and b in tools]
    head = ["figure", *(LABELS[t] for t in tools)]
    head += [f"{LABELS[a]} vs {LABELS[b]}: means / per round" for a, b in pairs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row.label]
        cells += [_fmt(row.means.get(t), row.key) + _sd(row.spreads.get(t)) for t in tools]
        for pair in pairs:
            d, q = row.diffs.get(pair), row.paired.get(pair)
            cells.append(_pctf(d) + ("" if q is None else f" / {100 * q:.2f}%"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cross_table(runs: Sequence[Run]) -> str:
    lines = ["| the other definition, on the same raw data | mean over rounds |", "|---|---|"]
    for tool, key, label in CROSS:
        values = [
            float(v) for r in runs if r.tool == tool and (v := r.figures.get(key)) is not None
        ]
        if values:
            lines.append(f"| {label} | {_fmt(statistics.fmean(values), key)} |")
    return "\n".join(lines)


def runs_table(runs: Sequence[Run]) -> str:
    keys = ("output_tok_s", "ttft_p50", "tpot_p50", "itl_p50", "e2e_p50", "duration_s")
    head = (
        "| round | tool | "
        + " | ".join(dict(FIGURES)[k] for k in keys)
        + " | completed | output tokens |"
    )
    lines = [head, "|" + "---|" * (len(keys) + 4)]
    for r in runs:
        f = r.figures
        cells = [str(r.round), LABELS[r.tool], *(_fmt(f.get(k), k) for k in keys)]
        cells += [f"{f.get('completed', 0):.0f}", f"{f.get('output_tokens', 0):.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
