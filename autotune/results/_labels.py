"""How results are named for people: the first objective's label and unit, and an
estimate with its interval (``931.2 +- 18.4 tok/s (95% CI, n=2)``), for every display.
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.results._estimates import ConfigEstimate
from autotune.results._trials import THROUGHPUT

OBJECTIVE_LABELS = {
    THROUGHPUT: ("output throughput", "tok/s"),
    "capacity_req_s": ("capacity", "req/s"),
    "capacity_streams": ("capacity", "streams"),
    "goodput_req_s": ("goodput", "req/s"),
    "output_tok_per_kj": ("energy efficiency", "tok/kJ"),
}
"""The first objective's stored name -> (what it is, its unit), for every display."""


def objective_label(metric_names: Sequence[str]) -> tuple[str, str]:
    """What the study's first objective is and its unit (``("capacity", "req/s")``)."""
    first = metric_names[0] if metric_names else THROUGHPUT
    return OBJECTIVE_LABELS.get(first, (first, ""))


def format_estimate(e: ConfigEstimate, unit: str = "tok/s") -> str:
    """``931.2 +- 18.4 tok/s (95% CI, n=2)``, or ``(n=1, CI unknown)`` without a noise figure."""
    if e.half_width is None:
        return f"{e.mean:,.1f} {unit} (n={e.n}, CI unknown: no repeated measurement yet)"
    return f"{e.mean:,.1f} +- {e.half_width:,.1f} {unit} (95% CI, n={e.n})"
