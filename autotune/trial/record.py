"""What one trial stores, typed: the writer (the pipeline, the study loop) and every reader
(best, report, status, exports, migrate) go through these models, never through loose keys.

A study keeps each field of a :class:`TrialRecord` as one Optuna user attribute (the stored
trial schema, docs/ARCHITECTURE.md), so optuna-dashboard shows them one by one and studies
written before ``schema_version`` existed still read: a missing version is 1, a missing
field takes its default, and keys this release does not know are kept aside, never lost.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autotune.errors import StorageError
from autotune.launch import ServiceStartup
from autotune.telemetry import Telemetry

SCHEMA_VERSION = 8
"""1: the attributes as written up to 2026-12 (no version key); 2: ``schema_version``,
``violations`` and ``engine_version`` added, every field typed here; 3: ``warm_start_from``
(a trial carried from an earlier study by a warm start, not one of this study's); 4:
``capacity`` (a capacity search's result) and ``curve`` (latency-throughput points); 5:
``client_cpus`` (where the load generator ran); 6: ``telemetry`` (the GPUs over the measured
phase, or why none); 7: ``startup`` (each restarted service's start-up stages, with when);
8: ``services[name].inherited_env`` (what a local service inherited from autotune's
environment that its engine reads: :mod:`autotune.trial.inherited_env`)."""

MEASURED_PHASES = ("restart", "probe", "warmup", "measure")
"""Time spent on the deployment; the rest of a trial is the tuner's own (``tuner``)."""

ConfigValue = bool | int | float | str
LOG_TAIL_CHARS = 4000


def zero_phases() -> dict[str, float]:
    return dict.fromkeys(MEASURED_PHASES, 0.0)


class ServiceRecord(BaseModel):
    """One service as it ran in a trial (``services[name]``).

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
    health_url: str | None = None
    inherited_env: dict[str, str] | None = None
    """Variables the service inherited from autotune's environment that its engine or the
    libraries under it read (:mod:`autotune.trial.inherited_env`); ``None``: not known (a
    service on another host, or a trial stored before schema 8)."""


class TrialRecord(BaseModel):
    """Everything a trial stores besides its values and constraints."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    schema_version: int = SCHEMA_VERSION
    config: dict[str, ConfigValue | None] = Field(default_factory=dict)
    """Parameter -> value: the active and the derived ones."""
    is_baseline: bool = False
    deployment: str | None = None
    failure: str | None = None
    """None, or a class of :mod:`autotune.failures`."""
    reason: str | None = None
    log_tail: str = ""
    violations: list[str] = Field(default_factory=list)
    """Forbidden rules the configuration broke (``failure: forbidden``)."""
    reused_from: int | None = None
    retry_of: int | None = None
    phase_seconds: dict[str, float] = Field(default_factory=zero_phases)
    services: dict[str, ServiceRecord] = Field(default_factory=dict)
    restarted: list[str] = Field(default_factory=list)
    startup: dict[str, ServiceStartup] = Field(default_factory=dict)
    """Service -> its start-up stages and when each began, for each service (re)started for
    the trial, healthy or failed (:mod:`autotune.launch.startup`): where the restart went."""
    effective: dict[str, Any] = Field(default_factory=dict)
    """Service -> the arguments the server reports it runs with (``/server_info``)."""
    overrides: list[str] = Field(default_factory=list)
    engine_version: dict[str, str] = Field(default_factory=dict)
    metrics: dict[str, Any] = Field(default_factory=dict)
    """The load generator's ``Metrics``, in the modeled hardware's time."""
    server_metrics: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Service -> what the server's own ``/metrics`` counted in the measured phase
    (:mod:`autotune.trial.server_metrics`): ``kv_usage_max``, ``preemptions``, ``ttft_mean_s``."""
    sim_speedup: float | None = None
    stop_reason: str | None = None
    aborted: str | None = None
    """Why the measure phase was cut short (clearly below the incumbent): the values are a
    partial estimate and the trial never wins unless re-measured."""
    cache_flushed: list[str] = Field(default_factory=list)
    """Services kept from the previous trial whose prefix cache was emptied before this one."""
    capacity: dict[str, Any] | None = None
    """A capacity search's result (:class:`autotune.trial.measurement.Measured`): the
    highest passing rate or concurrency, the failing one above it, why it stopped."""
    curve: list[dict[str, Any]] = Field(default_factory=list)
    """Latency-throughput points measured on the trial's processes (capacity probes or the
    study's ``curve:`` sweep), by ``x``: rate or concurrency, throughputs, latency stats."""
    client_cpus: str | None = None
    """The CPUs the load generator's thread ran on while it measured, read back inside the
    deployment's ``client_cpus`` placement (``None``: not placed)."""
    telemetry: Telemetry | None = None
    """The GPUs over the measured phase (utilization, memory, power, energy, J/token), or
    ``source: none`` and why (:mod:`autotune.telemetry`); ``None``: nothing was measured, or
    the trial predates telemetry."""
    warm_start_from: str | None = None
    """Set on a trial a warm start carried from an earlier study (``STUDY#N``: that study's
    trial N, a launch that failed there): evidence for the sampler, never one of this
    study's trials (counts, ``best``, the report, status, reuse and re-measurement skip it)."""
    extra: dict[str, Any] = Field(default_factory=dict, exclude=True)
    """Stored keys this release does not know (a newer writer's): kept, written back."""

    ALWAYS: ClassVar[tuple[str, ...]] = (
        "schema_version",
        "config",
        "is_baseline",
        "deployment",
        "failure",
        "reason",
        "reused_from",
        "phase_seconds",
    )
    """Written on every trial, even at their defaults (readers and tests look them up)."""

    def to_attrs(self) -> dict[str, Any]:
        """The user attributes to store: every field set, plus :attr:`ALWAYS`."""
        dumped = self.model_dump(mode="json")
        keep = set(self.model_fields_set) | set(self.ALWAYS)
        out = {k: _jsonable(v) for k, v in dumped.items() if k in keep}
        if isinstance(out.get("log_tail"), str):
            out["log_tail"] = out["log_tail"][-LOG_TAIL_CHARS:]
        return {**self.extra, **out}

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any], *, where: str = "trial") -> TrialRecord:
        """The record stored as ``attrs``; :class:`StorageError` naming ``where`` when they
        do not follow the schema."""
        known = {k: v for k, v in attrs.items() if k in cls.model_fields and k != "extra"}
        extra = {k: v for k, v in attrs.items() if k not in cls.model_fields}
        known.setdefault("schema_version", 1)
        for key in ("reason", "log_tail"):  # written as null or text over the versions
            if known.get(key) is None:
                known.pop(key, None)
        try:
            return cls.model_validate({**known, "extra": extra})
        except ValidationError as exc:
            raise StorageError(
                f"{where}: stored attributes do not follow the trial schema: {exc}"
            ) from exc


class RemeasureRecord(BaseModel):
    """One re-measurement of a trial's configuration (study attribute ``remeasure:N:R``)."""

    model_config = ConfigDict(extra="ignore")

    of: int
    repeat: int
    target: int | None = None
    """The trial target of the run that measured it: the race's round (its budget)."""
    values: list[float] = Field(default_factory=list)
    constraints: dict[str, float] = Field(default_factory=dict)
    feasible: bool = False
    metrics: dict[str, Any] = Field(default_factory=dict)
    phase_seconds: dict[str, float] = Field(default_factory=dict)
    failure: str | None = None
    reason: str | None = None
    stop_reason: str | None = None
    sim_speedup: float | None = None
    restarted: list[str] = Field(default_factory=list)
    capacity: dict[str, Any] | None = None
    """The capacity search's result, as the trial stores it (its bracket is the value's
    resolution: :func:`autotune.results.bracket_width`)."""
    telemetry: Telemetry | None = None
    startup: dict[str, ServiceStartup] = Field(default_factory=dict)
    """Each restarted service's start-up stages (a re-measurement starts its services
    afresh: as ``TrialRecord.startup``)."""
    inherited_env: dict[str, dict[str, str] | None] = Field(default_factory=dict)
    """What each service inherited from autotune's environment while re-measured (as
    ``ServiceRecord.inherited_env``; empty: written before re-measurements recorded it): a
    later session pools its runs with this one only under the same variables."""

    ALWAYS: ClassVar[tuple[str, ...]] = ("of", "repeat", "values", "constraints", "feasible")

    def to_attrs(self) -> dict[str, Any]:
        keep = set(self.model_fields_set) | set(self.ALWAYS)
        return {k: _jsonable(v) for k, v in self.model_dump(mode="json").items() if k in keep}


@dataclass
class TrialOutcome:
    """What evaluating one configuration produced: the objective's values, the constraint
    values (> 0 violated) and the record."""

    values: list[float]
    constraints: dict[str, float]
    record: TrialRecord = field(default_factory=TrialRecord)

    @property
    def failure(self) -> str | None:
        return self.record.failure

    @property
    def attrs(self) -> dict[str, Any]:
        """The user attributes this outcome stores (:meth:`TrialRecord.to_attrs`)."""
        return self.record.to_attrs()

    @property
    def feasible(self) -> bool:
        return all(v <= 0 for v in self.constraints.values())


def _jsonable(value: Any) -> Any:
    """Optuna stores attributes as JSON; NaN/inf and non-JSON types are made safe."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return json.loads(json.dumps(value, default=str))
