"""The report as markdown tables, and the default sampler's verdicts."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .summary import CHECKPOINTS, LAUNCH_CHECKPOINTS


def _n(x: float, budget: int) -> str:
    return f">{budget}" if x > budget else f"{x:.0f}"


def _trials_cell(q: Mapping[str, Any], budget: int) -> str:
    text = f"{_n(q['median'], budget)} [{_n(q['q1'], budget)}-{_n(q['q3'], budget)}]"
    text += f" {_n(q['min'], budget)}-{_n(q['max'], budget)}"
    return text + (f" ({q['not_reached']} n/r)" if q["not_reached"] else "")


def _best_cell(q: Mapping[str, Any] | None) -> str:
    """Median (min-max) of a best-at figure; with ``runs`` (launch checkpoints) the seeds that
    got that far when fewer than all; "-" where none did."""
    if q is None:
        return "-"
    text = f"{q['median']:.1f}% ({q['min']:.0f}-{q['max']:.0f})"
    if q.get("runs", 0) < q.get("of", 0):
        text += f" [{q['runs']} of {q['of']} runs]"
    return text


def markdown(report: Mapping[str, Any]) -> str:
    """The report as markdown tables (what BENCHMARKS.md quotes)."""
    budget = int(report["trials"])
    marks = [n for n in CHECKPOINTS if n <= budget]
    lines: list[str] = []
    for name, info in report["surfaces"].items():
        about = info["description"]
        if info.get("level") is not None and info.get("needle_fraction") is not None:
            about = (
                f"{info['level']}, needle fraction {100 * info['needle_fraction']:.3g}%: " + about
            )
        elif info.get("level") is not None:
            about = f"{info['level']}: {about}"
        lines += [f"#### {name}: optimum {info['optimum']:,.1f} ({about})", ""]
        lines += [
            "| sampler | trials to 90% | trials to 95% | trials to 99% | launches to 95% |",
            "|---|---|---|---|---|",
        ]
        for sampler, s in info["samplers"].items():
            lines.append(
                f"| {sampler} | {_trials_cell(s['to_90'], budget)} | "
                f"{_trials_cell(s['to_95'], budget)} | {_trials_cell(s['to_99'], budget)} | "
                f"{_n(s['to_95']['launches']['median'], budget)} |"
            )
        odds = info.get("random_odds") or {}
        if odds:
            lines.append(
                f"| random, expected (p per trial, {int(odds['draws']):,} draws) | "
                + " | ".join(
                    f"{odds[f'median_trials_{lv}']:.0f} (p={100 * odds[f'p{lv}']:.2f}%)"
                    for lv in ("90", "95", "99")
                )
                + " | |"
            )
        heads = [f"best @{n}" for n in marks]
        heads += [f"best @{n} launches" for n in LAUNCH_CHECKPOINTS]
        lines += ["", "| sampler | " + " | ".join(heads) + " |"]
        lines.append("|---|" + "---|" * len(heads))
        for sampler, s in info["samplers"].items():
            cells = [_best_cell(s["best_at"][str(n)]) for n in marks]
            at_launches = s.get("best_at_launches", {})
            cells += [_best_cell(at_launches.get(str(n))) for n in LAUNCH_CHECKPOINTS]
            lines.append(f"| {sampler} | " + " | ".join(cells) + " |")
        lines += [
            "",
            "| sampler | launches | crashed (wasted) | crash share | known-cause crash "
            "proposals | near-crash repeats | forbidden proposed / launched | duplicates | "
            "ask+suggest ms (last 20) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for sampler, s in info["samplers"].items():
            m = s["mean"]
            lines.append(
                f"| {sampler} | {m['launches']:.1f} | {m['crashes']:.1f} | "
                f"{100 * s['crash_share']:.1f}% | {100 * s['known_cause_share']:.1f}% | "
                f"{m['near_crash']:.1f} | {m['forbidden']:.1f} / {s['forbidden_launched']} | "
                f"{m['duplicates']:.1f} | {s['sampler_ms_last20']['mean']:.1f} |"
            )
        lines.append("")
    return "\n".join(lines)


def verdicts(report: Mapping[str, Any], *, default: str = "tpe") -> list[str]:
    """The issue's targets for the default sampler, one line each."""
    budget = int(report["trials"])
    out = []
    for name, info in report["surfaces"].items():
        samplers = info["samplers"]
        if default not in samplers:
            continue
        mine = samplers[default]["to_95"]["median"]
        line = f"{name}: default median trials to 95% = {_n(mine, budget)}"
        if "random" in samplers:
            theirs = samplers["random"]["to_95"]["median"]
            expected = (info.get("random_odds") or {}).get("median_trials_95")
            ratio = theirs / mine
            bound = ">=" if theirs > budget else "="
            line += f"; random {_n(theirs, budget)} -> ratio {bound} {ratio:.1f}x"
            if expected is not None and math.isfinite(expected):
                line += f" (random expected {expected:.0f} -> {expected / mine:.1f}x)"
        out.append(line)
    return out
