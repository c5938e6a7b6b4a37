from __future__ import annotations

from optuna.study import StudyDirection

from autotune.study.definition import SLOSettings
from autotune.study.objectives import FAILED_TPOT_MS, Objective


def _metrics(
    throughput: float = 900.0, tpot_p99: float = 20.0, ttft_p99: float = 300.0, err: float = 0.0
) -> dict:
    pct = lambda p99: {"mean": p99 / 2, "p50": p99 / 2, "p90": p99 * 0.9, "p99": p99}  # noqa: E731
    return {
        "output_throughput": throughput,
        "tpot_ms": pct(tpot_p99),
        "ttft_ms": pct(ttft_p99),
        "e2e_ms": pct(1000.0),
        "error_rate": err,
    }


def test_single_objective_values_and_keys() -> None:
    obj = Objective(kind="throughput", slo=SLOSettings())
    assert obj.directions == [StudyDirection.MAXIMIZE]
    assert obj.metric_names == ["output_throughput_tok_s"]
    assert obj.values(_metrics(throughput=812.5)) == [812.5]
    assert obj.constraint_keys == ["feasible", "slo_error_rate"]
    assert obj.constraints(_metrics()) == {"feasible": 0.0, "slo_error_rate": 0.0}


def test_multi_objective_reads_tpot_p99() -> None:
    obj = Objective(kind="throughput_vs_tpot", slo=SLOSettings())
    assert obj.directions == [StudyDirection.MAXIMIZE, StudyDirection.MINIMIZE]
    assert obj.values(_metrics(throughput=10.0, tpot_p99=42.0)) == [10.0, 42.0]
    assert obj.failed_values() == [0.0, FAILED_TPOT_MS]


def test_slo_constraints_positive_when_violated() -> None:
    obj = Objective(
        kind="throughput", slo=SLOSettings(tpot_p99_ms=25.0, ttft_p99_ms=500.0, max_error_rate=0.01)
    )
    c = obj.constraints(_metrics(tpot_p99=30.0, ttft_p99=200.0, err=0.0))
    assert c["slo_tpot_p99_ms"] == 5.0  # violated by 5 ms
    assert c["slo_ttft_p99_ms"] == -300.0  # met
    assert c["slo_error_rate"] == -0.01
    assert list(c) == obj.constraint_keys


def test_failed_constraints_cover_every_key() -> None:
    obj = Objective(kind="throughput", slo=SLOSettings(tpot_p99_ms=25.0))
    failed = obj.failed_constraints()
    assert set(failed) == set(obj.constraint_keys)
    assert all(v > 0 for v in failed.values())


def test_missing_latency_sample_is_not_a_crash() -> None:
    obj = Objective(kind="throughput_vs_tpot", slo=SLOSettings(tpot_p99_ms=30.0))
    m = _metrics()
    m["tpot_ms"] = {"mean": None, "p50": None, "p90": None, "p99": None}
    assert obj.values(m) == [900.0, FAILED_TPOT_MS]
    assert obj.constraints(m)["slo_tpot_p99_ms"] > 0
