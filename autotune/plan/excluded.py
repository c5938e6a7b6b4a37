"""What a fleet plan leaves out, and why: configurations that met the SLOs at no load
measured (no number of replicas of them meets a latency SLO), a re-measurement that failed,
trials that never ran.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from autotune.plan.model import Unplannable
from autotune.plan.rates import RateKind
from autotune.results import ConfigEstimate, TrialResult


def why_not(kind: RateKind, trial: TrialResult, estimate: ConfigEstimate | None) -> str:
    """Why a configuration (the baseline, say) is not planned, in words."""
    if trial.failure:
        return f"it did not run: {trial.failure}" + (
            f" ({trial.reason[:160]})" if trial.reason else ""
        )
    if estimate is not None and estimate.flaky:
        return estimate.flaky
    if not trial.feasible:
        return slo_reason(kind, trial)
    return "it has no full measurement (aborted early, or not complete)"


def slo_reason(kind: RateKind, trial: TrialResult) -> str:
    """What a measured configuration broke: at the lowest load its capacity search probed,
    else the constraints its one measurement broke."""
    points = [p for p in trial.curve if isinstance(p.get("x"), (int, float))]
    if kind in ("capacity", "streams") and points:
        low = min(points, key=lambda p: float(p["x"]))
        broke = "; ".join(str(v) for v in low.get("violations") or []) or "an SLO"
        load = "req/s" if (trial.capacity or {}).get("over", "rate") == "rate" else "streams"
        return (
            f"no load met the SLOs: at {float(low['x']):g} {load}, the lowest probed, it "
            f"broke {broke}"
        )
    keys = sorted(k for k, v in trial.constraints.items() if v > 0 and not k.isdigit())
    text = ", ".join(keys) or "an SLO"
    if kind == "stated":
        return (
            f"it broke {text} at the study's one load; a lower load was not measured, so "
            "no rate is known to meet the SLOs"
        )
    return f"it broke {text} at every load measured"


def never_met(
    kind: RateKind,
    results: Sequence[TrialResult],
    estimates: Sequence[ConfigEstimate],
    listed: set[int],
) -> list[Unplannable]:
    """Distinct measured configurations that met the SLOs at no load measured, then those a
    failed re-measurement made unusable; the baseline and the trials in ``listed`` are said
    elsewhere."""
    out: list[Unplannable] = []
    seen: set[str] = set()
    for r in results:
        if (
            not r.complete
            or r.feasible
            or r.failure is not None
            or r.reused_from is not None
            or not r.metrics
            or r.number in listed
            or r.is_baseline
        ):
            continue
        key = config_key(r)
        if key in seen:
            continue
        seen.add(key)
        out.append(Unplannable(label="", trial=r.number, reason=slo_reason(kind, r)))
    for e in estimates:
        if e.flaky and e.trial.number not in listed and config_key(e.trial) not in seen:
            seen.add(config_key(e.trial))
            out.append(Unplannable(label="", trial=e.trial.number, reason=e.flaky))
    return out


def failed_counts(results: Sequence[TrialResult]) -> dict[str, int]:
    """Trials that did not run to a measurement, by failure class, most first."""
    counts: dict[str, int] = {}
    for r in results:
        if r.failure and r.reused_from is None:
            counts[r.failure] = counts.get(r.failure, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def config_key(trial: TrialResult) -> str:
    """One configuration, however many trials measured it."""
    if not trial.config:
        return f"#{trial.number}"
    return json.dumps(trial.config, sort_keys=True, default=str)
