"""Reading finished trials back out of an Optuna study into typed models.

The study stores every trial the same way: values, constraint keys, and the fields of a
:class:`~autotune.trial.record.TrialRecord` as user attributes (the model the writer uses
too). Report and export read trials only through :class:`TrialResult`, built from that
record, so a schema change is absorbed in the record module, in one place.

Noise: one measurement of a configuration is one draw (on the simulated deployment each
server process runs a few percent faster or slower than the model, and that does not
average out within a run). The best single-run figure of a study is therefore biased up and
often not the best configuration. So the winner is picked per configuration from all its
measurements (the trial plus its re-measurements, stored as study attributes
``remeasure:N:R``) by a lower 95% confidence bound (:class:`ConfigEstimate`), with the
study's run-to-run noise pooled over every configuration measured more than once. The
re-measure phase's race (``autotune.study.race``) works on the same intervals and the same
candidates (:func:`winner_candidates`), so the configuration it leaves in front is the one
:func:`best_estimate` picks.

Why one module of ~640 lines: the readers (best, Pareto front, estimates with their
confidence intervals) rank the same trials by the same rules; one module keeps one rule.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autotune.errors import StorageError
from autotune.telemetry import Telemetry
from autotune.trial.record import ConfigValue, ServiceRecord, TrialRecord

THROUGHPUT = "output_throughput_tok_s"
TPOT_P99 = "tpot_p99_ms"
REMEASURE_PREFIX = "remeasure:"
"""Study user attribute ``remeasure:N:R``: re-measurement R (1, 2, ...) of trial N's config."""
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


def pareto_front(study: optuna.Study) -> list[TrialResult]:
    """Feasible, fully measured (not early-aborted) COMPLETE trials not dominated by another
    (by the study's directions)."""
    directions = study.directions
    candidates = [t for t in own_trials(study) if feasible(t) and not t.user_attrs.get("aborted")]
    front = [
        t
        for t in candidates
        if not any(dominates(o.values, t.values, directions) for o in candidates if o is not t)
    ]
    return [TrialResult.from_frozen(t, metric_names=study.metric_names) for t in front]


def best_trial(study: optuna.Study) -> TrialResult | None:
    """The trial to deploy: the configuration with the highest conservative throughput.

    Single objective: every feasible, fully measured configuration is ranked by
    :attr:`ConfigEstimate.lower` (its mean when the study has no repeated measurement, so
    then simply the highest throughput); an early-aborted trial is not a candidate unless
    re-measured, nor is a configuration whose re-measurement failed. Multi-objective studies
    pick from the feasible Pareto front the same way. Ties go to the higher mean, the lower
    TPOT p99, then the earlier trial. ``None`` when no trial qualifies.
    """
    best = best_estimate(study)
    return best.trial if best is not None else None


def best_estimate(study: optuna.Study) -> ConfigEstimate | None:
    """The winning configuration's estimate (see :func:`best_trial`)."""
    ranked = winner_candidates(study)
    return ranked[0] if ranked else None


def winner_candidates(
    study: optuna.Study, estimates: Sequence[ConfigEstimate] | None = None
) -> list[ConfigEstimate]:
    """The configurations :func:`best_estimate` chooses from, best first, one per distinct
    configuration: eligible estimates (on the feasible Pareto front in a multi-objective
    study) ranked by the lower bound, then the mean, the lower TPOT p99, the earlier trial.

    The re-measurement race (``autotune.study.race``) races exactly these, in this order,
    so the configuration it leaves in front is the one ``best`` reports. ``estimates``:
    :func:`config_estimates` of the study, when the caller has read them already.
    """
    if estimates is None:
        estimates = config_estimates(study)
    estimates = [e for e in estimates if e.eligible]
    if len(study.directions) > 1:
        front = {r.number for r in pareto_front(study)}
        estimates = [e for e in estimates if e.trial.number in front]
    return _distinct(sorted(estimates, key=_rank))


def _distinct(ranked: Iterable[ConfigEstimate]) -> list[ConfigEstimate]:
    """The first estimate of each distinct configuration, in ``ranked``'s order."""
    seen: set[str] = set()
    out = []
    for e in ranked:
        key = _config_key(e)
        if key and key in seen:
            continue
        seen.add(key)
        out.append(e)
    return out


def _rank(e: ConfigEstimate) -> tuple[float, float, float, int]:
    """How ``best`` orders configurations: lower bound, mean, TPOT p99, trial number."""
    tpot = e.trial.tpot_p99_ms if e.trial.tpot_p99_ms is not None else math.inf
    return (-e.lower, -e.mean, tpot, e.trial.number)


def ranked_estimates(study: optuna.Study) -> list[ConfigEstimate]:
    """Every eligible configuration, best first, in the order :func:`best_estimate` ranks
    them (its first is ``best``'s winner); with several objectives the Pareto front's come
    first. A warm start takes its top configurations from here."""
    estimates = sorted((e for e in config_estimates(study) if e.eligible), key=_rank)
    if len(study.directions) > 1:
        front = {r.number for r in pareto_front(study)}
        estimates.sort(key=lambda e: e.trial.number not in front)  # stable: rank kept
    return estimates


def _config_key(e: ConfigEstimate) -> str:
    return json.dumps(e.trial.config, sort_keys=True, default=str) if e.trial.config else ""


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


def dominates(
    a: Sequence[float] | None, b: Sequence[float] | None, directions: Sequence[StudyDirection]
) -> bool:
    """``a`` is at least as good as ``b`` in every objective and better in one."""
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


# --- noise: re-measurements and confidence intervals ------------------------------------

_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
"""Student t 97.5% quantiles for 1..30 degrees of freedom (two-sided 95% intervals)."""


@functools.lru_cache(maxsize=1024)
def t_quantile(confidence: float, df: int) -> float:
    """The half-width factor of a two-sided ``confidence`` interval with ``df`` degrees of
    freedom (Student t; 0.95 gives :func:`t975`, the table ``best`` has always used).

    Exact for integer degrees of freedom: the t distribution's closed form (Abramowitz and
    Stegun 26.7.3-4) inverted by bisection; no SciPy at run time.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError("confidence must be between 0 and 1")
    if df < 1:
        raise ValueError("degrees of freedom must be >= 1")
    if abs(confidence - 0.95) < 1e-12:
        return t975(df)
    low, high = 0.0, 1.0
    while _t_within(high, df) < confidence:
        high *= 2.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        if _t_within(mid, df) < confidence:
            low = mid
        else:
            high = mid
        if high - low <= 1e-12 * high:
            break
    return 0.5 * (low + high)


def _t_within(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` (integer) degrees of freedom."""
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    term = total = 1.0
    if df % 2:
        for j in range(1, (df - 1) // 2):
            term *= c2 * (2 * j) / (2 * j + 1)
            total += term
        tail = s * math.cos(theta) * total if df > 1 else 0.0
        return 2.0 / math.pi * (theta + tail)
    for j in range(1, df // 2):
        term *= c2 * (2 * j - 1) / (2 * j)
        total += term
    return s * total


def half_width(
    mean: float, n: int, sd: float | None, df: int, *, confidence: float = 0.95
) -> float | None:
    """Half-width of a configuration's ``confidence`` interval: ``n`` measurements of mean
    ``mean`` with the study's pooled relative noise ``sd`` (``df`` degrees of freedom);
    ``None`` while there is no noise figure."""
    if sd is None or df < 1 or n < 1:
        return None
    return t_quantile(confidence, df) * sd * mean / math.sqrt(n)


def conservative(mean: float, half: float | None) -> float:
    """The lower bound ``best`` ranks by: ``mean - half``, the mean itself without a noise
    figure, never below 0 (see :attr:`ConfigEstimate.lower`)."""
    return max(mean - (half or 0.0), 0.0)


def t975(df: int) -> float:
    """Student t 97.5% quantile (no SciPy at run time: a table, then Cornish-Fisher)."""
    if df < 1:
        raise ValueError("degrees of freedom must be >= 1")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959963984540054
    v = float(df)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
    )


def remeasure_key(number: int, repeat: int) -> str:
    return f"{REMEASURE_PREFIX}{number}:{repeat}"


class Measurement(BaseModel):
    """One measurement of a configuration: its trial, or a re-measurement of it."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    of: int
    """The trial whose configuration was measured."""
    repeat: int = 0
    """0 for the trial itself, 1, 2, ... for re-measurements."""
    throughput: float | None = None
    tpot_p99_ms: float | None = None
    feasible: bool = False
    failure: str | None = None
    reason: str = ""
    aborted: str | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    phase_seconds: dict[str, float] = Field(default_factory=dict)
    target: int | None = None
    """A re-measurement's round: the trial target of the run that made it (``None``: the
    trial itself, or written before rounds were recorded)."""
    resolution: float | None = None
    """Relative width of the bracket a capacity search read its value from (upper / capacity
    - 1): the value is the bracket's lower end, so it cannot tell loads inside it apart."""

    @property
    def full(self) -> bool:
        """A feasible measurement that ran to its end (usable for the estimate)."""
        return self.feasible and self.aborted is None and self.throughput is not None


def _first_value(raw: Mapping[str, Any]) -> float | None:
    """A re-measurement's first objective value (capacity, goodput or throughput); records
    without ``values`` hold a throughput study's, read from its metrics."""
    values = raw.get("values")
    if isinstance(values, list) and values and raw.get("feasible") and raw.get("failure") is None:
        first = values[0]
        if isinstance(first, (int, float)) and not isinstance(first, bool) and math.isfinite(first):
            return float(first)
    return metric_value(raw.get("metrics") or {}, "output_throughput")


def bracket_width(capacity: Mapping[str, Any] | None) -> float | None:
    """A capacity search's relative bracket width (``upper / capacity - 1``), ``None`` when
    it has no upper end (the limit passed, nothing failed) or found no capacity."""
    if not isinstance(capacity, Mapping):
        return None
    lo, hi = capacity.get("capacity"), capacity.get("upper")
    if not isinstance(lo, (int, float)) or not isinstance(hi, (int, float)) or lo <= 0:
        return None
    return max(float(hi) / float(lo) - 1.0, 0.0)


def load_remeasurements(study: optuna.Study) -> list[Measurement]:
    """Every re-measurement stored on the study (``remeasure:N:R``), by (N, R)."""
    out = []
    for key, raw in study.user_attrs.items():
        if not key.startswith(REMEASURE_PREFIX) or not isinstance(raw, Mapping):
            continue
        try:
            out.append(
                Measurement(
                    of=int(raw["of"]),
                    repeat=int(raw["repeat"]),
                    throughput=_first_value(raw),
                    tpot_p99_ms=metric_value(raw.get("metrics") or {}, "tpot_ms", "p99"),
                    feasible=bool(raw.get("feasible")),
                    failure=raw.get("failure"),
                    reason=str(raw.get("reason") or ""),
                    metrics=raw.get("metrics") or {},
                    phase_seconds=_phase_seconds(raw.get("phase_seconds")),
                    target=_optional_int(raw.get("target")),
                    resolution=bracket_width(raw.get("capacity")),
                )
            )
        except (KeyError, TypeError, ValueError, ValidationError) as exc:
            raise StorageError(
                f"study attribute {key}: not a re-measurement record: {exc}"
            ) from exc
    return sorted(out, key=lambda m: (m.of, m.repeat))


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


class ConfigEstimate(BaseModel):
    """All measurements of one configuration and what they say about its throughput."""

    model_config = ConfigDict(frozen=True)

    trial: TrialResult
    """The trial that first measured it (what ``best`` shows and exports)."""
    measurements: list[Measurement]
    """The trial's own measurement first, then its re-measurements."""
    n: int
    """Full, feasible measurements behind :attr:`mean`."""
    mean: float
    half_width: float | None
    """95% confidence half-width (t-based, the study's pooled run-to-run noise); ``None``
    while the study has no repeated measurement to estimate that noise from."""
    noise_sd: float | None = None
    """The study's pooled relative run-to-run standard deviation (0.03 = 3%)."""
    noise_df: int = 0
    flaky: str | None = None
    """Set when a re-measurement failed or violated a constraint: never the winner."""

    @property
    def lower(self) -> float:
        """The conservative estimate ``best`` ranks by: the lower 95% confidence bound
        (the mean itself while the noise is unknown), never below 0. A bound under zero says
        only that the noise is larger than the estimate; left negative it would rank a
        slower configuration above a faster one (the bound of a relative noise falls faster
        for a larger mean), so such configurations tie at 0 and their means decide."""
        return conservative(self.mean, self.half_width)

    @property
    def remeasured(self) -> int:
        return sum(1 for m in self.measurements if m.repeat > 0)

    @property
    def eligible(self) -> bool:
        return self.n > 0 and self.flaky is None and self.trial.feasible


def _own_measurement(r: TrialResult) -> Measurement:
    return Measurement(
        of=r.number,
        throughput=r.throughput,
        tpot_p99_ms=r.tpot_p99_ms,
        feasible=r.feasible,
        failure=r.failure,
        reason=r.reason,
        aborted=r.aborted,
        metrics=r.metrics,
        phase_seconds=r.phase_seconds,
        resolution=bracket_width(r.capacity),
    )


def noise_level(
    groups: Sequence[Sequence[float]], *, widths: Sequence[float] = ()
) -> tuple[float | None, int]:
    """Pooled relative standard deviation of repeated measurements, and its degrees of freedom.

    Relative because the noise is multiplicative (a process runs x% fast or slow), so one
    figure serves every configuration, measured once or many times.

    ``widths``: the relative bracket widths capacity readings were taken from
    (:func:`bracket_width`). Such a value is the bracket's lower end, so with the true
    capacity anywhere in it its SD is ``w / sqrt(12)``; the pooled figure is at least that
    (root-mean-square over the readings). Without it, repeats that land on the same bisection
    point pool to 0 and an interval of zero width: ``best`` claimed 64.0 +- 0 req/s for a
    capacity bracketed by 64.0 and 90.5, and the race stopped as if it were exact.
    """
    ss = 0.0
    df = 0
    for values in groups:
        if len(values) < 2:
            continue
        mean = sum(values) / len(values)
        if mean <= 0:
            continue
        ss += sum((v / mean - 1.0) ** 2 for v in values)
        df += len(values) - 1
    if not df:
        return None, 0
    sd = math.sqrt(ss / df)
    if widths:
        sd = max(sd, math.sqrt(sum(w * w for w in widths) / len(widths) / 12.0))
    return sd, df


def config_estimates(study: optuna.Study) -> list[ConfigEstimate]:
    """One estimate per measured configuration (COMPLETE trials not reused from another).

    A configuration's measurements are its trial's (unless early-aborted: a measurement cut
    short because it looked low is biased low) and its re-measurements.
    """
    results = [r for r in load_results(study) if r.complete and r.reused_from is None]
    extra: dict[int, list[Measurement]] = {}
    for m in load_remeasurements(study):
        extra.setdefault(m.of, []).append(m)
    rows = []
    for r in results:
        if not r.feasible:
            continue
        ms = [_own_measurement(r), *extra.get(r.number, [])]
        rows.append((r, ms, [m.throughput for m in ms if m.full and m.throughput is not None]))
    sd, df = noise_level(
        [values for _, _, values in rows],
        widths=[
            m.resolution for _, ms, _ in rows for m in ms if m.full and m.resolution is not None
        ],
    )
    out = []
    for r, ms, values in rows:
        bad = next((m for m in ms if m.repeat > 0 and not m.feasible), None)
        flaky = None
        if bad is not None:
            why = f"{bad.failure}: {bad.reason}" if bad.failure else "a constraint was violated"
            flaky = f"re-measurement {bad.repeat} failed ({why})"[:300]
        n = len(values)
        mean = sum(values) / n if n else (r.throughput or 0.0)
        half = half_width(mean, n, sd, df)
        out.append(
            ConfigEstimate(
                trial=r,
                measurements=ms,
                n=n,
                mean=mean,
                half_width=half,
                noise_sd=sd,
                noise_df=df,
                flaky=flaky,
            )
        )
    return out


def remeasure_candidates(study: optuna.Study, top_k: int) -> list[ConfigEstimate]:
    """The ``top_k`` distinct feasible, fully measured configurations by mean throughput."""
    ranked = sorted(
        (e for e in config_estimates(study) if e.eligible),
        key=lambda e: (-e.mean, e.trial.number),
    )
    return _distinct(ranked)[:top_k]


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
