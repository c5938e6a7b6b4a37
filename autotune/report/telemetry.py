"""The GPUs in the report: the best trial's telemetry in the summary (utilization, peak
memory, power, J/token, or why there is none), and the top table's GPU columns.

Only what the trials stored (:class:`autotune.telemetry.Telemetry`); a study written before
telemetry, or measured where no GPU could be read, shows no columns, and its summary says
why when the trials recorded a reason.
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.report._common import _e, _num
from autotune.results import TrialResult

TOP_HEADS = ["J/token", "GPU power W", "GPU util %", "GPU mem peak MiB"]
"""The top table's GPU columns (mean power of the GPUs together, mean utilization, the
fullest GPU's peak)."""


def summary_rows(best: TrialResult | None) -> list[tuple[str, str]]:
    """The best trial's telemetry as summary rows (none for a trial without a record)."""
    if best is None or best.telemetry is None:
        return []
    return [(f"best trial: {label}", text) for label, text in best.telemetry.rows()]


def top_columns(ranked: Sequence[TrialResult]) -> tuple[list[str], list[list[str]]]:
    """The GPU columns' heads and each ranked trial's cells (escaped HTML); no columns when
    no ranked trial measured its GPUs."""
    if not any(r.telemetry is not None and r.telemetry.available for r in ranked):
        return [], [[] for _ in ranked]
    cells = []
    for r in ranked:
        t = r.telemetry
        if t is None or not t.available:
            why = "not recorded" if t is None else f"none: {t.reason}"
            cells.append([f'<span title="{_e(why)}">n/a</span>'] + ["n/a"] * (len(TOP_HEADS) - 1))
            continue
        per_token = "n/a" if t.energy_per_token_j is None else f"{t.energy_per_token_j:.4g}"
        cells.append(
            [
                per_token,
                _num(t.power_mean_w),
                _num(t.util_mean_pct),
                _num(t.memory_used_max_mib, 0),
            ]
        )
    return list(TOP_HEADS), cells
