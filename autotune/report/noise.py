"""Run-to-run noise and re-measurement (shown once a configuration was measured more than
once): the best configurations with every measurement, mean +- 95% CI and the lower bound
the winner is picked by.
"""

from __future__ import annotations

from autotune.report._common import TOP_N, _e, _num, _section_open, _table
from autotune.report._data import ReportData


def section(data: ReportData) -> str | None:
    """The best configurations with every measurement, mean +- 95% CI and the lower bound
    the winner is picked by."""
    winner, objective = data.winner, data.objective
    eligible = [e for e in data.estimates if e.n > 0]
    sd, df = (eligible[0].noise_sd, eligible[0].noise_df) if eligible else (None, 0)
    if sd is None:  # no configuration measured twice: the top table has every figure
        return None
    head = _section_open("noise", "Noise and re-measurement")
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
