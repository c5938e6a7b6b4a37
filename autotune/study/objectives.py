"""From measured metrics to Optuna values and constraints.

Constraint keys are the same on every trial (Optuna's contract): ``feasible`` (1 when the
trial could not be measured: forbidden, crashed, wrong output) and one key per SLO
(measured - limit, so > 0 means violated). A trial that could not be measured still gets
finite values (zero throughput, a large TPOT) so that the samplers learn from it instead of
re-proposing it, which FAIL trials would not give them.

The ``energy`` objective scores the GPUs' energy per output token of the measured phase
(:mod:`autotune.telemetry`) as its reciprocal, output tokens per kilojoule: higher is better
like every other first objective, so ``best``'s conservative bound, the re-measurement
race, early comparisons and ``explain``'s effects need no second convention, and the
configuration with the highest lower bound of tok/kJ is the one whose J/token has the lowest
upper bound. A trial measured without that figure is not scored at all
(:class:`~autotune.trial.pipeline.Unscorable`: infeasible, ``no_telemetry``, with the
reason), since any number standing in for it would rank it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from optuna.study import StudyDirection

from autotune.failures import Failure
from autotune.study.definition import SLOSettings
from autotune.trial.pipeline import Unscorable

THROUGHPUT = "output_throughput_tok_s"
CAPACITY = "capacity"
GOODPUT = "goodput_req_s"
TPOT_P99 = "tpot_p99_ms"
TTFT_P99 = "ttft_p99_ms"
ENERGY = "output_tok_per_kj"
"""The ``energy`` objective's stored name: output tokens per kJ of GPU energy (1000 / J per
token)."""
FAILED_LATENCY_MS = 1.0e6
"""Latency assigned to an unmeasurable trial in multi-objective studies: dominated by any
real one."""
FAILED_TPOT_MS = FAILED_LATENCY_MS

PRIMARY = {"throughput": THROUGHPUT, "capacity": CAPACITY, "goodput": GOODPUT, "energy": ENERGY}
"""What an objective maximizes -> its stored name. Capacity's unit is its search's
(``capacity_req_s`` or ``capacity_streams``, see :attr:`Objective.metric_names`)."""
LATENCY = {"tpot": ("tpot_ms", TPOT_P99), "ttft": ("ttft_ms", TTFT_P99)}
"""The latency an objective may minimize beside it -> (metrics key, stored name)."""


def _p99(metrics: Mapping[str, Any], name: str) -> float | None:
    value = (metrics.get(name) or {}).get("p99")
    return None if value is None else float(value)


def tokens_per_kj(metrics: Mapping[str, Any]) -> float:
    """Output tokens per kJ from the score inputs' ``energy_per_token_j``;
    :class:`Unscorable` (``no_telemetry``) with the reason when there is none."""
    per_token = metrics.get("energy_per_token_j")
    if isinstance(per_token, (int, float)) and per_token > 0:
        return 1000.0 / float(per_token)
    why = metrics.get("energy_unknown") or "no GPU telemetry was recorded"
    raise Unscorable(
        f"the energy objective needs the GPUs' energy per output token: {why}",
        failure=Failure.no_telemetry.value,
    )


@dataclass(frozen=True)
class Objective:
    """What is optimized: names, directions and how to read values from metrics.

    ``kind`` is ``PRIMARY`` or ``PRIMARY_vs_LATENCY`` (``throughput``, ``capacity_vs_tpot``,
    ...: :data:`autotune.study.definition.OBJECTIVES`). Throughput is output tok/s of the
    load; capacity the highest rate (or concurrency) meeting the SLOs, found by the trial's
    capacity search; goodput the requests/s meeting every SLO at the load's rate; energy the
    output tokens per kJ of GPU energy at the load (1000 / J per token). The latency
    objective is the p99 measured at that load (for capacity: at capacity).
    """

    kind: str
    slo: SLOSettings
    capacity_over: str = "rate"

    @property
    def primary(self) -> str:
        return self.kind.split("_vs_")[0]

    @property
    def latency(self) -> str | None:
        parts = self.kind.split("_vs_")
        return parts[1] if len(parts) > 1 else None

    @property
    def metric_names(self) -> list[str]:
        first = PRIMARY[self.primary]
        if first == CAPACITY:
            first = "capacity_req_s" if self.capacity_over == "rate" else "capacity_streams"
        return [first] + ([LATENCY[self.latency][1]] if self.latency else [])

    @property
    def directions(self) -> list[StudyDirection]:
        return [StudyDirection.MAXIMIZE] + ([StudyDirection.MINIMIZE] if self.latency else [])

    @property
    def constraint_keys(self) -> list[str]:
        keys = ["feasible"]
        if self.slo.ttft_p99_ms is not None:
            keys.append("slo_ttft_p99_ms")
        if self.slo.tpot_p99_ms is not None:
            keys.append("slo_tpot_p99_ms")
        if self.slo.e2e_p99_ms is not None:
            keys.append("slo_e2e_p99_ms")
        keys.append("slo_error_rate")
        return keys

    def values(self, metrics: Mapping[str, Any]) -> list[float]:
        primary = self.primary
        if primary == "capacity":
            first = float(metrics["capacity"])
        elif primary == "goodput":
            first = float(metrics["goodput"])
        elif primary == "energy":
            first = tokens_per_kj(metrics)
        else:
            first = float(metrics["output_throughput"])
        if self.latency is None:
            return [first]
        latency = _p99(metrics, LATENCY[self.latency][0])
        return [first, FAILED_LATENCY_MS if latency is None else latency]

    def failed_values(self) -> list[float]:
        return [0.0] + ([FAILED_LATENCY_MS] if self.latency else [])

    def constraints(self, metrics: Mapping[str, Any]) -> dict[str, float]:
        """Constraint values for a measured trial, in :attr:`constraint_keys` order."""
        out = {"feasible": 0.0}
        for key, metric, limit in (
            ("slo_ttft_p99_ms", "ttft_ms", self.slo.ttft_p99_ms),
            ("slo_tpot_p99_ms", "tpot_ms", self.slo.tpot_p99_ms),
            ("slo_e2e_p99_ms", "e2e_ms", self.slo.e2e_p99_ms),
        ):
            if limit is not None:
                measured = _p99(metrics, metric)
                # No sample (e.g. TPOT with one-token outputs) cannot prove the SLO is met.
                out[key] = 1.0 if measured is None else measured - limit
        out["slo_error_rate"] = float(metrics["error_rate"]) - self.slo.max_error_rate
        return out

    def failed_constraints(self) -> dict[str, float]:
        """Every key violated: the configuration could not be measured at all."""
        return {key: 1.0 for key in self.constraint_keys}
