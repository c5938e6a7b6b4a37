"""From measured metrics to Optuna values and constraints.

Constraint keys are the same on every trial (Optuna's contract): ``feasible`` (1 when the
trial could not be measured: forbidden, crashed, wrong output) and one key per SLO
(measured - limit, so > 0 means violated). A trial that could not be measured still gets
finite values (zero throughput, a large TPOT) so that the samplers learn from it instead of
re-proposing it, which FAIL trials would not give them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from optuna.study import StudyDirection

from autotune.study.definition import SLOSettings

THROUGHPUT = "output_throughput_tok_s"
TPOT_P99 = "tpot_p99_ms"
FAILED_TPOT_MS = 1.0e6
"""TPOT assigned to an unmeasurable trial in multi-objective studies: dominated by any real one."""


def _p99(metrics: Mapping[str, Any], name: str) -> float | None:
    value = (metrics.get(name) or {}).get("p99")
    return None if value is None else float(value)


@dataclass(frozen=True)
class Objective:
    """What is optimized: names, directions and how to read values from metrics."""

    kind: str
    slo: SLOSettings

    @property
    def metric_names(self) -> list[str]:
        return [THROUGHPUT] if self.kind == "throughput" else [THROUGHPUT, TPOT_P99]

    @property
    def directions(self) -> list[StudyDirection]:
        if self.kind == "throughput":
            return [StudyDirection.MAXIMIZE]
        return [StudyDirection.MAXIMIZE, StudyDirection.MINIMIZE]

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
        throughput = float(metrics["output_throughput"])
        if self.kind == "throughput":
            return [throughput]
        tpot = _p99(metrics, "tpot_ms")
        return [throughput, FAILED_TPOT_MS if tpot is None else tpot]

    def failed_values(self) -> list[float]:
        return [0.0] if self.kind == "throughput" else [0.0, FAILED_TPOT_MS]

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
