"""Failure classes (shown when a trial failed or broke a constraint): how many trials of
each, which, and the first reason.
"""

from __future__ import annotations

from autotune.report._common import _e, _section_open, _table
from autotune.report._data import ReportData
from autotune.results import TrialResult


def section(data: ReportData) -> str | None:
    failed = [r for r in data.results if r.failure]
    slo = [r for r in data.results if r.complete and not r.failure and not r.feasible]
    if not failed and not slo:
        return None
    head = _section_open("failures", "Failure classes")
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
