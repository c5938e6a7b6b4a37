"""Every measurement of a configuration and what they say about its throughput.

One measurement is one draw: a trial's own figure plus its re-measurements (study user
attributes ``remeasure:N:R``, read as :class:`Measurement`) are pooled into one
:class:`ConfigEstimate` per configuration, with its mean and a 95% confidence interval from
the study's pooled noise (:mod:`autotune.results._noise`). Which estimate wins is the
ranking's business (:mod:`autotune.results._ranking`), not this module's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autotune.errors import StorageError
from autotune.launch import ServiceStartup
from autotune.results._noise import conservative, half_width, noise_level
from autotune.results._trials import TrialResult, _phase_seconds, load_results, metric_value
from autotune.telemetry import Telemetry

REMEASURE_PREFIX = "remeasure:"
"""Study user attribute ``remeasure:N:R``: re-measurement R (1, 2, ...) of trial N's config."""


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
    startup: dict[str, ServiceStartup] = Field(default_factory=dict)
    """A re-measurement's start-up stages per service (the trial's own are on its
    :class:`TrialResult`)."""
    machine: str | None = None
    """The GPUs it ran on (:attr:`autotune.telemetry.Telemetry.machine`); None where no
    GPU telemetry was recorded."""
    card: str | None = None
    """Their kind (:attr:`autotune.telemetry.Telemetry.card`: "NVIDIA H200"); None where no
    GPU telemetry was recorded."""

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
            telemetry = _telemetry(raw.get("telemetry"))
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
                    startup=raw.get("startup") or {},
                    machine=None if telemetry is None else telemetry.machine,
                    card=None if telemetry is None else telemetry.card,
                )
            )
        except (KeyError, TypeError, ValueError, ValidationError) as exc:
            raise StorageError(
                f"study attribute {key}: not a re-measurement record: {exc}"
            ) from exc
    return sorted(out, key=lambda m: (m.of, m.repeat))


def machines_of(measurements: Sequence[Measurement]) -> dict[str | None, int]:
    """How many of ``measurements`` ran on each machine (:attr:`Measurement.machine`), in
    the order first seen; one key where they shared one (or none recorded any)."""
    out: dict[str | None, int] = {}
    for m in measurements:
        out[m.machine] = out.get(m.machine, 0) + 1
    return out


def cards_of(measurements: Sequence[Measurement]) -> dict[str, int]:
    """How many of ``measurements`` ran on each kind of GPU (:attr:`Measurement.card`), most
    first; those without GPU telemetry are left out."""
    out: dict[str, int] = {}
    for m in measurements:
        if m.card is not None:
            out[m.card] = out.get(m.card, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def cards_text(cards: Mapping[str, int], winner: Sequence[str | None]) -> str | None:
    """What ``best`` and the report say when a study's runs span several kinds of GPU (a
    study resumed on whatever card a lease gave: :mod:`autotune.study.cards`): which, how
    many runs each, and the winner's; None for one kind or none recorded."""
    if len(cards) < 2:
        return None
    counts = ", ".join(f"{card}: {n}" for card, n in cards.items())
    own = sorted({c for c in winner if c is not None})
    return (
        f"{len(cards)} kinds of GPU ({counts} runs): the ranking compares runs across them; "
        f"the winner's ran on {', '.join(own) or 'no recorded GPU'}"
    )


def _telemetry(raw: Any) -> Telemetry | None:
    """A stored re-measurement's ``telemetry`` (None: none recorded)."""
    return None if not isinstance(raw, Mapping) else Telemetry.model_validate(raw)


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
        machine=None if r.telemetry is None else r.telemetry.machine,
        card=None if r.telemetry is None else r.telemetry.card,
    )


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


def study_cards(
    study: optuna.Study, estimates: Sequence[ConfigEstimate] | None = None
) -> dict[str, int]:
    """The kinds of GPU the study's runs (trials and re-measurements) recorded, with their
    counts (:func:`cards_of`). ``estimates``: :func:`config_estimates` of the study, when the
    caller has read them already."""
    if estimates is None:
        estimates = config_estimates(study)
    return cards_of([m for e in estimates for m in e.measurements])
