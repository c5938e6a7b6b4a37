"""Where one replica's request rate comes from, by the study's first objective, and how many
replicas a rate needs.

* ``capacity_req_s``: the capacity itself (req/s under the SLOs);
* ``capacity_streams`` (a search over concurrency): the request throughput measured at
  capacity, scaled by the capacity's lower bound over its mean;
* anything else (one load level per configuration): ``--per-replica-rate``, stated for the
  winner, each other configuration scaled by its objective relative to the winner's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from autotune.errors import ConfigError
from autotune.plan.settings import PlanSettings
from autotune.results import THROUGHPUT, ConfigEstimate, TrialResult, metric_value, objective_label

RateKind = Literal["capacity", "streams", "stated"]

CAPACITY_RATE = "capacity_req_s"
CAPACITY_STREAMS = "capacity_streams"


def replicas_needed(provisioned: float, rate_lower: float) -> int:
    """``ceil(provisioned / rate_lower)``, at least 1. A quotient that floating point puts a
    hair above a whole number (``12.000000000000002``) counts as that number."""
    if rate_lower <= 0 or provisioned <= 0:
        raise ValueError("rates must be positive")
    quotient = provisioned / rate_lower
    return max(1, math.ceil(quotient - 1e-9 * quotient))


@dataclass(frozen=True)
class Rate:
    mean: float
    lower: float
    n: int


def rate_kind(metric_names: Sequence[str], settings: PlanSettings) -> RateKind:
    """Where the per-replica rate comes from; a :class:`ConfigError` when the study measured
    no capacity and no rate was stated, or when a rate is stated for a capacity study."""
    first = metric_names[0] if metric_names else THROUGHPUT
    what, unit = objective_label(metric_names)
    if first in (CAPACITY_RATE, CAPACITY_STREAMS):
        if settings.per_replica_rate is not None:
            raise ConfigError(
                f"this study measured each configuration's capacity ({unit}); "
                "--per-replica-rate is for a study that measured none",
                field="--per-replica-rate",
            )
        return "capacity" if first == CAPACITY_RATE else "streams"
    if settings.per_replica_rate is None:
        raise ConfigError(
            f"the study's objective is {what} ({unit or first}) at one load: it measured no "
            "capacity (the highest request rate under the SLOs). Give --per-replica-rate, the "
            "req/s one replica of the winner sustains under your SLOs, or plan a study with "
            "objective: capacity",
            field="--per-replica-rate",
        )
    return "stated"


def per_replica_rate(
    kind: RateKind,
    settings: PlanSettings,
    winner: ConfigEstimate,
    trial: TrialResult,
    mean: float,
    lower: float,
    n: int,
    estimate: ConfigEstimate | None = None,
) -> Rate | None:
    """The per-replica rate (req/s) of a configuration measured at ``mean`` (lower 95%
    bound ``lower``, ``n`` measurements) of the study's first objective; ``None`` when it
    cannot be read (a concurrency capacity without a request throughput)."""
    if kind == "capacity":
        return Rate(mean, lower, n)
    if kind == "streams":
        rates = [
            v
            for m in (estimate.measurements if estimate is not None else ())
            if m.full and (v := metric_value(m.metrics, "request_throughput")) is not None
        ] or [v for v in [metric_value(trial.metrics, "request_throughput")] if v is not None]
        if not rates or mean <= 0:
            return None
        rate = sum(rates) / len(rates)
        return Rate(rate, rate * lower / mean, n)
    assert settings.per_replica_rate is not None
    stated = settings.per_replica_rate
    if winner.mean <= 0:
        return None
    low_ref = winner.lower if winner.lower > 0 else winner.mean
    return Rate(stated * mean / winner.mean, stated * lower / low_ref, n)


def rate_source(kind: RateKind, settings: PlanSettings, what: str) -> str:
    """Where the rates come from, in words (``what``: the first objective's name)."""
    if kind == "capacity":
        return (
            "each configuration's capacity: the highest Poisson request rate at which "
            "every SLO held, found by the trial's search (the lower end of its last "
            "bracket); its lower 95% bound over every measurement of that configuration"
        )
    if kind == "streams":
        return (
            "each configuration's capacity in concurrent streams, as a request rate: the "
            "request throughput measured at capacity, times the capacity's lower 95% bound "
            "over its mean"
        )
    return (
        f"--per-replica-rate {settings.per_replica_rate:g} req/s for the winner; every other "
        f"configuration's rate is that times its {what} relative to the winner's (mean to "
        "mean, lower bound to lower bound)"
    )
