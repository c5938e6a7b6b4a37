"""Reading finished trials back out of an Optuna study into typed models.

The study stores every trial the same way (the stored trial schema: values, constraint keys,
user attributes ``config``, ``services``, ``metrics``, ...). Report and export read trials
only through :class:`TrialResult`, so a schema change is absorbed here, in one place.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autotune.errors import StorageError

THROUGHPUT = "output_throughput_tok_s"
TPOT_P99 = "tpot_p99_ms"

ConfigValue = bool | int | float | str


class ServiceRecord(BaseModel):
    """One service as it ran in a trial (``user_attrs["services"][name]``).

    ``depends_on``, ``ready_timeout_s`` and ``workdir`` are optional: when the study did not
    store them, exporters infer dependencies from the command lines and use a default
    start-up timeout.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    command: str = ""
    argv: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    unset_env: list[str] = Field(default_factory=list)
    fingerprint: str = ""
    depends_on: list[str] | None = None
    ready_timeout_s: float | None = None
    workdir: str | None = None


class TrialResult(BaseModel):
    """A finished trial, typed: what the report shows and what the exporters write."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    number: int
    state: str
    values: list[float] | None = None
    metric_names: list[str] = Field(default_factory=list)
    params: dict[str, Any] = Field(default_factory=dict)
    config: dict[str, ConfigValue | None] = Field(default_factory=dict)
    services: dict[str, ServiceRecord] = Field(default_factory=dict)
    metrics: dict[str, Any] = Field(default_factory=dict)
    phase_seconds: dict[str, float] = Field(default_factory=dict)
    constraints: dict[str, float] = Field(default_factory=dict)
    failure: str | None = None
    reason: str = ""
    log_tail: str = ""
    is_baseline: bool = False
    reused_from: int | None = None
    effective: dict[str, Any] = Field(default_factory=dict)
    overrides: list[str] = Field(default_factory=list)
    deployment: str | None = None
    restarted: list[str] = Field(default_factory=list)
    duration_s: float | None = None
    feasible: bool = False
    throughput: float | None = None
    """Output throughput in tok/s (the first objective)."""
    tpot_p99_ms: float | None = None
    """TPOT p99 in ms: the second objective if there is one, else from the stored metrics."""

    @property
    def complete(self) -> bool:
        return self.state == TrialState.COMPLETE.name

    @property
    def measured(self) -> bool:
        """True when a load test produced metrics (SLO violations are measured, crashes not)."""
        return self.failure is None and bool(self.metrics) and self.throughput is not None

    @classmethod
    def from_frozen(
        cls, trial: FrozenTrial, *, metric_names: Sequence[str] | None = None
    ) -> TrialResult:
        """Build from a FrozenTrial; malformed attributes raise :class:`StorageError`."""
        attrs = trial.user_attrs
        names = list(metric_names) if metric_names else _default_names(trial.values)
        values = list(trial.values) if trial.values is not None else None
        metrics = attrs.get("metrics") or {}
        try:
            return cls(
                number=trial.number,
                state=trial.state.name,
                values=values,
                metric_names=names,
                params=dict(trial.params),
                config=attrs.get("config") or {},
                services=attrs.get("services") or {},
                metrics=metrics,
                phase_seconds=_phase_seconds(attrs.get("phase_seconds")),
                constraints=dict(trial.constraints),
                failure=attrs.get("failure"),
                reason=str(attrs.get("reason") or ""),
                log_tail=str(attrs.get("log_tail") or ""),
                is_baseline=bool(attrs.get("is_baseline", False)),
                reused_from=attrs.get("reused_from"),
                effective=attrs.get("effective") or {},
                overrides=[str(o) for o in attrs.get("overrides") or []],
                deployment=attrs.get("deployment"),
                restarted=[str(s) for s in attrs.get("restarted") or []],
                duration_s=trial.duration.total_seconds() if trial.duration else None,
                feasible=feasible(trial),
                throughput=_throughput(values, names, metrics),
                tpot_p99_ms=_tpot(values, names, metrics, failed=attrs.get("failure") is not None),
            )
        except ValidationError as exc:
            raise StorageError(
                f"trial {trial.number}: stored attributes do not follow the trial schema: {exc}"
            ) from exc


def feasible(trial: FrozenTrial) -> bool:
    """COMPLETE with values and every constraint <= 0 (Optuna's definition of feasible)."""
    if trial.state != TrialState.COMPLETE or not trial.values:
        return False
    if any(not math.isfinite(v) for v in trial.values):
        return False
    return all(c <= 0.0 for c in trial.constraints.values())


def load_results(study: optuna.Study) -> list[TrialResult]:
    """Every trial of the study, in trial-number order."""
    names = study.metric_names
    return [
        TrialResult.from_frozen(t, metric_names=names) for t in study.get_trials(deepcopy=False)
    ]


def pareto_front(study: optuna.Study) -> list[TrialResult]:
    """Feasible COMPLETE trials not dominated by another (by the study's directions)."""
    directions = study.directions
    candidates = [t for t in study.get_trials(deepcopy=False) if feasible(t)]
    front = [
        t
        for t in candidates
        if not any(_dominates(o.values, t.values, directions) for o in candidates if o is not t)
    ]
    return [TrialResult.from_frozen(t, metric_names=study.metric_names) for t in front]


def best_trial(study: optuna.Study) -> TrialResult | None:
    """The trial to deploy: highest throughput among feasible COMPLETE trials.

    Multi-objective studies pick from the feasible Pareto front; ties go to the lower TPOT
    p99, then to the earlier trial. ``None`` when no trial is feasible.
    """
    if len(study.directions) == 1:
        pool = [r for r in load_results(study) if r.feasible]
    else:
        pool = pareto_front(study)
    pool = [r for r in pool if r.throughput is not None]
    if not pool:
        return None
    return min(
        pool,
        key=lambda r: (
            -(r.throughput or 0.0),
            r.tpot_p99_ms if r.tpot_p99_ms is not None else math.inf,
            r.number,
        ),
    )


def baseline_trial(study: optuna.Study) -> TrialResult | None:
    """The measured baseline (user attr ``is_baseline``): the first feasible one, else the first."""
    baselines = [r for r in load_results(study) if r.is_baseline]
    for result in baselines:
        if result.feasible:
            return result
    return baselines[0] if baselines else None


def gain_over_baseline(trial: TrialResult, baseline: TrialResult | None) -> float | None:
    """Throughput ratio trial / baseline (40.0 = 40x); ``None`` without a usable baseline.

    A ratio, not a percentage: the baselines this tool meets are often an order of magnitude
    below the tuned result.
    """
    if baseline is None or not baseline.feasible or not trial.feasible:
        return None
    if not baseline.throughput or trial.throughput is None:
        return None
    return trial.throughput / baseline.throughput


def _default_names(values: Sequence[float] | None) -> list[str]:
    if values is not None and len(values) >= 2:
        return [THROUGHPUT, TPOT_P99]
    return [THROUGHPUT]


def _objective(
    values: Sequence[float] | None, names: Sequence[str], name: str, fallback: int | None
) -> float | None:
    if not values:
        return None
    if name in names:
        index = list(names).index(name)
    elif fallback is not None:
        index = fallback
    else:
        return None
    if index >= len(values) or not math.isfinite(values[index]):
        return None
    return float(values[index])


def _metric(metrics: Mapping[str, Any], key: str, sub: str | None = None) -> float | None:
    value: Any = metrics.get(key)
    if sub is not None:
        value = value.get(sub) if isinstance(value, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _throughput(
    values: Sequence[float] | None, names: Sequence[str], metrics: Mapping[str, Any]
) -> float | None:
    value = _objective(values, names, THROUGHPUT, 0)
    return value if value is not None else _metric(metrics, "output_throughput")


def _tpot(
    values: Sequence[float] | None,
    names: Sequence[str],
    metrics: Mapping[str, Any],
    *,
    failed: bool,
) -> float | None:
    """Measured TPOT p99; an unmeasured trial's placeholder objective value is not a TPOT."""
    measured = _metric(metrics, "tpot_ms", "p99")
    if measured is not None:
        return measured
    if not failed and values is not None and len(values) >= 2:
        return _objective(values, names, TPOT_P99, 1)
    return None


def _phase_seconds(raw: Any) -> dict[str, float]:
    if not isinstance(raw, Mapping):
        return {}
    out: dict[str, float] = {}
    for key, value in raw.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[str(key)] = float(value)
    return out


def _dominates(
    a: Sequence[float] | None, b: Sequence[float] | None, directions: Sequence[StudyDirection]
) -> bool:
    if a is None or b is None:
        return False
    better = False
    for x, y, d in zip(a, b, directions, strict=False):
        if d == StudyDirection.MINIMIZE:
            x, y = -x, -y
        if x < y:
            return False
        if x > y:
            better = True
    return better
