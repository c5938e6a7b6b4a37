"""A finished trial, typed (:class:`TrialResult`), and which of a study's trials are read.

The study stores every trial the same way: values, constraint keys, and the fields of a
:class:`~autotune.trial.record.TrialRecord` as user attributes (the model the writer uses
too). Report and export read trials only through :class:`TrialResult`, built from that
record, so a schema change is absorbed in the record module, in one place. Beside it: what
makes a trial feasible, which trials are the study's own (not carried in by a warm start),
the objective values and metrics read off a trial, and the baseline with the gain over it.

The bottom of :mod:`autotune.results`: it imports none of its siblings, so the estimates and
the ranking above it read trials one way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autotune.errors import StorageError
from autotune.launch import ServiceStartup
from autotune.telemetry import Telemetry
from autotune.trial.record import ConfigValue, ServiceRecord, TrialRecord

THROUGHPUT = "output_throughput_tok_s"
TPOT_P99 = "tpot_p99_ms"

WARM_START_ATTR = "warm_start_from"
"""Trial user attribute ``STUDY#N`` of a trial a warm start carried from an earlier study."""


class TrialResult(BaseModel):
    """A finished trial, typed: what the report shows and what the exporters write."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    number: int
    label: str = ""
    """What of the trial this is: empty for the trial itself, ``minimal`` for its minimal
    winner (``autotune explain``), which the exporters name as such."""
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
    aborted: str | None = None
    """Why the measure phase was cut short (clearly below the incumbent): the values are a
    partial estimate and the trial never wins unless re-measured."""
    effective: dict[str, Any] = Field(default_factory=dict)
    overrides: list[str] = Field(default_factory=list)
    server_metrics: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Service -> what its own ``/metrics`` counted in the measured phase."""
    telemetry: Telemetry | None = None
    """The GPUs over the measured phase, with J/token (``TrialRecord.telemetry``)."""
    capacity: dict[str, Any] | None = None
    """A capacity search's result (``TrialRecord.capacity``)."""
    curve: list[dict[str, Any]] = Field(default_factory=list)
    """Latency-throughput points on the modeled clock (``TrialRecord.curve``), by ``x``."""
    engine_version: dict[str, str] = Field(default_factory=dict)
    deployment: str | None = None
    restarted: list[str] = Field(default_factory=list)
    startup: dict[str, ServiceStartup] = Field(default_factory=dict)
    """Service -> its start-up stages (``TrialRecord.startup``)."""
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
    def title(self) -> str:
        """How exports name it: ``trial 7``, ``trial 7 (minimal winner)``."""
        return f"trial {self.number}" + (" (minimal winner)" if self.label == "minimal" else "")

    @property
    def slug(self) -> str:
        """Its exported files' stem: ``trial-7``, ``trial-7-minimal``."""
        return f"trial-{self.number}" + (f"-{self.label}" if self.label else "")

    @property
    def measured(self) -> bool:
        """True when a load test produced metrics (SLO violations are measured, crashes not)."""
        return self.failure is None and bool(self.metrics) and self.throughput is not None

    @classmethod
    def from_frozen(
        cls, trial: FrozenTrial, *, metric_names: Sequence[str] | None = None
    ) -> TrialResult:
        """Build from a FrozenTrial; malformed attributes raise :class:`StorageError`."""
        record = TrialRecord.from_attrs(trial.user_attrs, where=f"trial {trial.number}")
        names = list(metric_names) if metric_names else _default_names(trial.values)
        values = list(trial.values) if trial.values is not None else None
        try:
            return cls(
                number=trial.number,
                state=trial.state.name,
                values=values,
                metric_names=names,
                params=dict(trial.params),
                config=record.config,
                services=record.services,
                metrics=record.metrics,
                phase_seconds=_with_storage_write(trial, _phase_seconds(record.phase_seconds)),
                constraints=dict(trial.constraints),
                failure=record.failure,
                reason=record.reason or "",
                log_tail=record.log_tail,
                is_baseline=record.is_baseline,
                reused_from=record.reused_from,
                aborted=record.aborted or None,
                effective=record.effective,
                overrides=record.overrides,
                server_metrics=record.server_metrics,
                telemetry=record.telemetry,
                capacity=record.capacity,
                curve=record.curve,
                engine_version=record.engine_version,
                deployment=record.deployment,
                restarted=record.restarted,
                startup=record.startup,
                duration_s=trial.duration.total_seconds() if trial.duration else None,
                feasible=feasible(trial),
                throughput=_throughput(values, names, record.metrics),
                tpot_p99_ms=_tpot(values, names, record.metrics, failed=record.failure is not None),
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


def carried(trial: FrozenTrial) -> bool:
    """A trial a warm start carried from an earlier study (user attribute
    ``warm_start_from``): what the sampler learns from, never one of this study's trials."""
    return bool(trial.user_attrs.get(WARM_START_ATTR))


def launched(trial: FrozenTrial) -> bool:
    """``trial`` started its configuration (crashed or not): neither a forbidden one (nothing
    started) nor a reuse of an identical configuration's result. What a restart budget counts
    (the side-by-side's arms) and what the sampler's start-up may count
    (``autotune.study.hints.STARTUP_COUNTS``)."""
    attrs = trial.user_attrs
    return attrs.get("failure") != "forbidden" and attrs.get("reused_from") is None


def own_trials(
    study: optuna.Study, *, states: Sequence[TrialState] | None = None
) -> list[FrozenTrial]:
    """The study's own trials (``states`` only, if given), carried ones left out: what every
    count, ranking and listing reads."""
    trials = study.get_trials(deepcopy=False, states=tuple(states) if states else None)
    return [t for t in trials if not carried(t)]


def load_results(study: optuna.Study) -> list[TrialResult]:
    """Every trial of the study (its own: carried ones are not), in trial-number order."""
    names = study.metric_names
    return [TrialResult.from_frozen(t, metric_names=names) for t in own_trials(study)]


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


def metric_value(metrics: Mapping[str, Any], key: str, sub: str | None = None) -> float | None:
    """A finite number stored in a trial's metrics (``sub``: a statistic of a distribution,
    ``p99``); None when absent or not a number."""
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
    return value if value is not None else metric_value(metrics, "output_throughput")


def _tpot(
    values: Sequence[float] | None,
    names: Sequence[str],
    metrics: Mapping[str, Any],
    *,
    failed: bool,
) -> float | None:
    """Measured TPOT p99; an unmeasured trial's placeholder objective value is not a TPOT."""
    measured = metric_value(metrics, "tpot_ms", "p99")
    if measured is not None:
        return measured
    if not failed and values is not None and len(values) >= 2:
        second_named = len(names) >= 2 and names[1] != TPOT_P99
        return _objective(values, names, TPOT_P99, None if second_named else 1)
    return None


def _phase_seconds(raw: Any) -> dict[str, float]:
    if not isinstance(raw, Mapping):
        return {}
    out: dict[str, float] = {}
    for key, value in raw.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[str(key)] = float(value)
    return out


def _with_storage_write(trial: FrozenTrial, phases: dict[str, float]) -> dict[str, float]:
    """``phases`` with the trial's own storage write added to ``tuner`` and ``total``.

    The loop closes a trial's phases before it stores them, so the write (journal, the
    attributes, the state) is not in them; Optuna's timestamps bracket it (start: the trial
    row is created in ``ask``; complete: the state is written), so the span beyond
    ``total`` is that write. Without it the tuner's share would leave out its largest cost.
    """
    start, end, total = trial.datetime_start, trial.datetime_complete, phases.get("total")
    if start is None or end is None or total is None:
        return phases
    write = (end - start).total_seconds() - total
    if write > 0:
        phases["tuner"] = phases.get("tuner", 0.0) + write
        phases["total"] = total + write
    return phases
