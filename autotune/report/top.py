"""The top feasible trials (shown when one is feasible): their figures, GPU columns where
telemetry was recorded, configurations and commands.
"""

from __future__ import annotations

from autotune.report._common import (
    TOP_N,
    _command,
    _e,
    _num,
    _ranked,
    _ratio,
    _section_open,
    _table,
)
from autotune.report._data import ReportData
from autotune.report.telemetry import top_columns
from autotune.results import gain_over_baseline
from autotune.trial import ServiceRecord


def section(data: ReportData) -> str | None:
    baseline, objective = data.baseline, data.objective
    ranked = _ranked(data.results)[:TOP_N]
    if not ranked:  # the summary says there is no feasible trial
        return None
    head = _section_open("top", f"Top {TOP_N} feasible trials")
    gpu_heads, gpu_cells = top_columns(ranked)
    rows = []
    for rank, r in enumerate(ranked, 1):
        config = "\n".join(f"{k} = {v}" for k, v in sorted(r.config.items()))
        commands = "\n\n".join(
            f"# {name}\n{_inherited(rec)}{_command(rec)}" for name, rec in r.services.items()
        )
        rows.append(
            [
                str(rank),
                str(r.number) + (" (baseline)" if r.is_baseline else ""),
                _num(r.throughput),
                _num(r.tpot_p99_ms),
                _ratio(gain_over_baseline(r, baseline)),
                *gpu_cells[rank - 1],
                f'<pre class="cfg">{_e(config)}</pre>',
                f"<pre>{_e(commands)}</pre>",
            ]
        )
    table = _table(
        ["#", "trial", objective.column, "TPOT p99 ms", "gain", *gpu_heads, "config", "commands"],
        rows,
        numeric={2, 3, 4, *range(5, 5 + len(gpu_heads))},
    )
    return head + table + "</section>"


def _inherited(rec: ServiceRecord) -> str:
    """A comment line with what the service inherited from autotune's environment."""
    if not rec.inherited_env:
        return ""
    pairs = " ".join(f"{k}={v}" for k, v in rec.inherited_env.items())
    return f"# inherited from autotune's environment: {pairs}\n"
