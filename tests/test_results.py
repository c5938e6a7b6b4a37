"""Reading trials back from real SQLite studies that follow the stored trial schema."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from conftest_results import (
    BASELINE_PARAMS,
    FAILED_TPOT_MS,
    TrialSpec,
    make_study,
    typical_specs,
)
from optuna.trial import TrialState

from autotune import results
from autotune.errors import StorageError
from autotune.results import (
    TrialResult,
    baseline_trial,
    best_estimate,
    best_trial,
    config_estimates,
    feasible,
    format_estimate,
    gain_over_baseline,
    load_remeasurements,
    load_results,
    pareto_front,
    remeasure_candidates,
    remeasure_key,
    t975,
    t_quantile,
    winner_candidates,
)

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


def test_trial_result_reads_every_schema_field(tmp_path: Path) -> None:
    study = make_study(
        tmp_path,
        [TrialSpec(throughput=812.5, tpot_p99_ms=31.0, is_baseline=True)],
        multi=True,
    )
    (result,) = load_results(study)
    assert result.number == 0 and result.state == "COMPLETE"
    assert result.feasible and result.measured and result.is_baseline
    assert result.throughput == 812.5 and result.tpot_p99_ms == 31.0
    assert result.metric_names == ["output_throughput_tok_s", "tpot_p99_ms"]
    assert result.config["speculative_num_draft_tokens"] == 4
    assert result.config["moe_runner_backend"] == "marlin"
    assert set(result.services) == {"prefill", "decode", "router"}
    decode = result.services["decode"]
    assert decode.env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert decode.unset_env == ["NCCL_PROTO"]
    assert decode.argv[1:3] == ["-m", "autotune.sim.server"]
    assert result.phase_seconds["restart"] == 40.0
    assert result.metrics["ttft_ms"]["p99"] == 200.0
    assert result.constraints["feasible"] == 0.0
    assert result.deployment == "sim-dsv4-flash-pd.yaml"


def test_failed_trial_has_no_fake_tpot(tmp_path: Path) -> None:
    """A crashed trial stores a placeholder TPOT objective; it must not read as a measurement."""
    study = make_study(tmp_path, [TrialSpec(failure="cuda_oom")], multi=True)
    (result,) = load_results(study)
    assert study.trials[0].values == [0.0, FAILED_TPOT_MS]
    assert result.failure == "cuda_oom" and "decode" in result.reason
    assert not result.feasible and not result.measured
    assert result.tpot_p99_ms is None
    assert result.throughput == 0.0


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (TrialSpec(), True),
        (TrialSpec(failure="nccl_error"), False),
        (TrialSpec(slo_violation=3.0), False),
        (TrialSpec(slo_violation=0.0), True),
        (TrialSpec(state=TrialState.FAIL), False),
        (TrialSpec(state=TrialState.RUNNING), False),
    ],
)
def test_feasible(tmp_path: Path, spec: TrialSpec, expected: bool) -> None:
    study = make_study(tmp_path, [spec])
    assert feasible(study.trials[0]) is expected


def test_best_single_objective_ignores_infeasible_and_failed(tmp_path: Path) -> None:
    study = make_study(
        tmp_path,
        [
            TrialSpec(throughput=25.0, is_baseline=True),
            TrialSpec(throughput=900.0, slo_violation=10.0),  # fastest, violates the SLO
            TrialSpec(throughput=700.0),
            TrialSpec(throughput=0.0, failure="cuda_oom"),
            TrialSpec(throughput=650.0),
            TrialSpec(state=TrialState.FAIL),
        ],
    )
    best = best_trial(study)
    assert best is not None
    assert best.number == 2 and best.throughput == 700.0


def test_best_multi_objective_is_on_the_feasible_pareto_front(tmp_path: Path) -> None:
    study = make_study(
        tmp_path,
        [
            TrialSpec(throughput=500.0, tpot_p99_ms=20.0),
            TrialSpec(throughput=800.0, tpot_p99_ms=60.0),
            TrialSpec(throughput=800.0, tpot_p99_ms=40.0),  # same speed, lower tail: wins
            TrialSpec(throughput=950.0, tpot_p99_ms=30.0, slo_violation=1.0),
            TrialSpec(throughput=300.0, tpot_p99_ms=90.0),  # dominated
        ],
        multi=True,
    )
    front = {r.number for r in pareto_front(study)}
    assert front == {0, 2}
    best = best_trial(study)
    assert best is not None and best.number == 2


@pytest.mark.parametrize("multi", [False, True])
def test_best_is_none_without_feasible_trials(tmp_path: Path, multi: bool) -> None:
    assert best_trial(make_study(tmp_path / "empty", [], multi=multi)) is None
    only_bad = make_study(
        tmp_path,
        [TrialSpec(failure="cuda_oom"), TrialSpec(slo_violation=2.0)],
        multi=multi,
    )
    assert best_trial(only_bad) is None


def test_baseline_and_gain(tmp_path: Path) -> None:
    study = make_study(
        tmp_path,
        [TrialSpec(throughput=25.0, is_baseline=True), TrialSpec(throughput=1000.0)],
    )
    base = baseline_trial(study)
    best = best_trial(study)
    assert base is not None and base.number == 0
    assert best is not None
    assert gain_over_baseline(best, base) == pytest.approx(40.0)
    assert gain_over_baseline(best, None) is None


def test_gain_is_none_when_the_baseline_failed(tmp_path: Path) -> None:
    study = make_study(
        tmp_path,
        [TrialSpec(failure="cuda_oom", is_baseline=True), TrialSpec(throughput=1000.0)],
    )
    base = baseline_trial(study)
    best = best_trial(study)
    assert base is not None and not base.feasible
    assert best is not None and gain_over_baseline(best, base) is None


def test_feasible_baseline_preferred_over_earlier_failed_one(tmp_path: Path) -> None:
    study = make_study(
        tmp_path,
        [
            TrialSpec(failure="readiness_timeout", is_baseline=True),
            TrialSpec(throughput=30.0, is_baseline=True),
        ],
    )
    base = baseline_trial(study)
    assert base is not None and base.number == 1


def test_no_baseline(tmp_path: Path) -> None:
    assert baseline_trial(make_study(tmp_path, [TrialSpec()])) is None


def test_reads_back_after_reopening_the_storage(tmp_path: Path) -> None:
    make_study(tmp_path, typical_specs(30), multi=True)
    reopened = optuna.load_study(
        study_name="autotune-test", storage=f"sqlite:///{tmp_path / 'study.db'}"
    )
    results = load_results(reopened)
    assert len(results) == 30
    assert any(not r.feasible for r in results) and any(r.feasible for r in results)
    best = best_trial(reopened)
    assert best is not None
    assert best.throughput == max(r.throughput or 0 for r in results if r.feasible)


def test_malformed_attributes_raise_storage_error(tmp_path: Path) -> None:
    study = make_study(tmp_path, [])
    study.add_trial(
        optuna.trial.create_trial(
            value=1.0,
            params={"mem_fraction_static": 0.8},
            distributions={
                "mem_fraction_static": optuna.distributions.FloatDistribution(0.7, 0.95)
            },
            user_attrs={"services": ["not", "a", "mapping"], "config": dict(BASELINE_PARAMS)},
        )
    )
    with pytest.raises(StorageError, match="trial 0"):
        load_results(study)


def test_trial_without_autotune_attributes_is_still_readable(tmp_path: Path) -> None:
    """A trial added by hand (no user attrs) reads as feasible with defaults."""
    study = make_study(tmp_path, [])
    study.add_trial(
        optuna.trial.create_trial(
            value=42.0,
            params={"mem_fraction_static": 0.8},
            distributions={
                "mem_fraction_static": optuna.distributions.FloatDistribution(0.7, 0.95)
            },
        )
    )
    (result,) = load_results(study)
    assert isinstance(result, TrialResult)
    assert result.throughput == 42.0 and result.services == {} and result.feasible


# --- noise: re-measurements, confidence intervals, early-aborted trials ------------------


def _remeasure(
    study: optuna.Study, of: int, repeat: int, throughput: float, **extra: object
) -> None:
    """A re-measurement record as the runner stores it (study attribute remeasure:N:R)."""
    record = {
        "of": of,
        "repeat": repeat,
        "values": [throughput],
        "feasible": True,
        "failure": None,
        "reason": None,
        "metrics": {"output_throughput": throughput, "tpot_ms": {"p99": 20.0}},
        "phase_seconds": {"restart": 1.0, "probe": 0.1, "warmup": 1.0, "measure": 2.0},
        **extra,
    }
    study.set_user_attr(remeasure_key(of, repeat), record)


def _params(mem: float) -> dict[str, object]:
    return {**BASELINE_PARAMS, "mem_fraction_static": mem}


def test_t_quantiles_match_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 5, 10, 29, 30, 31, 40, 60, 120, 1000):
        assert t975(df) == pytest.approx(stats.t.ppf(0.975, df), rel=2e-4), df


def test_t_quantiles_at_any_confidence_match_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    for confidence in (0.5, 0.8, 0.9, 0.99, 0.999):
        for df in (1, 2, 3, 4, 7, 30, 31, 200):
            expected = stats.t.ppf((1 + confidence) / 2, df)
            assert t_quantile(confidence, df) == pytest.approx(expected, rel=1e-9), (confidence, df)
    assert t_quantile(0.95, 3) == t975(3)  # the table best has always used
    with pytest.raises(ValueError):
        t_quantile(1.0, 3)


def test_winner_candidates_are_bests_choices_in_its_order(tmp_path: Path) -> None:
    study = make_study(
        tmp_path,
        [
            TrialSpec(throughput=1000.0, params=_params(0.70)),
            TrialSpec(throughput=980.0, params=_params(0.71)),
            TrialSpec(throughput=500.0, params=_params(0.72)),
            TrialSpec(throughput=990.0, failure="crashed", params=_params(0.73)),
        ],
    )
    _remeasure(study, 1, 1, 990.0, target=7)
    _remeasure(study, 2, 1, 520.0)
    ranked = winner_candidates(study)
    assert [e.trial.number for e in ranked] == [1, 0, 2]
    best = best_estimate(study)
    assert best is not None and best.trial.number == ranked[0].trial.number
    assert [m.target for m in load_remeasurements(study)] == [7, None]


def test_without_repeats_the_ci_is_unknown_and_ranking_is_by_the_single_run(
    tmp_path: Path,
) -> None:
    study = make_study(tmp_path, [TrialSpec(throughput=700.0), TrialSpec(throughput=710.0)])
    estimates = {e.trial.number: e for e in config_estimates(study)}
    assert estimates[1].half_width is None and estimates[1].lower == 710.0
    assert "CI unknown" in format_estimate(estimates[1])
    best = best_estimate(study)
    assert best is not None and best.trial.number == 1


def test_best_ranks_by_the_lower_confidence_bound(tmp_path: Path) -> None:
    """A single lucky run loses to a slightly lower configuration measured twice."""
    study = make_study(
        tmp_path,
        [
            TrialSpec(throughput=1000.0, params=_params(0.70)),  # #0: one run
            TrialSpec(throughput=980.0, params=_params(0.71)),  # #1: re-measured at 990
            TrialSpec(throughput=500.0, params=_params(0.72)),  # #2: re-measured at 520
        ],
    )
    _remeasure(study, 1, 1, 990.0)
    _remeasure(study, 2, 1, 520.0)
    est = {e.trial.number: e for e in config_estimates(study)}
    # pooled relative SD over #1 and #2, 2 degrees of freedom
    ss = 2 * (10 / 1970) ** 2 + 2 * (20 / 1020) ** 2
    sd = (ss / 2) ** 0.5
    assert est[1].noise_sd == pytest.approx(sd) and est[1].noise_df == 2
    assert est[1].n == 2 and est[1].mean == pytest.approx(985.0)
    assert est[1].half_width == pytest.approx(t975(2) * sd * 985.0 / 2**0.5)
    assert est[0].n == 1 and est[0].half_width == pytest.approx(t975(2) * sd * 1000.0)
    assert est[0].mean > est[1].mean and est[1].lower > est[0].lower
    best = best_trial(study)
    assert best is not None and best.number == 1
    assert "+- " in format_estimate(est[1]) and "n=2" in format_estimate(est[1])
    assert [e.trial.number for e in remeasure_candidates(study, 2)] == [0, 1]


def test_an_aborted_trial_never_wins_unless_re_measured(tmp_path: Path) -> None:
    study = make_study(tmp_path, [TrialSpec(throughput=700.0), TrialSpec(throughput=900.0)])
    study.add_trial(
        optuna.trial.create_trial(
            value=950.0,  # a partial estimate, highest of all
            params={"mem_fraction_static": 0.8},
            distributions={
                "mem_fraction_static": optuna.distributions.FloatDistribution(0.7, 0.95)
            },
            user_attrs={
                "config": {"mem_fraction_static": 0.8},
                "failure": None,
                "aborted": "upper 95% bound 960 < 0.9 x incumbent",
                "metrics": {"output_throughput": 950.0},
            },
        )
    )
    results = load_results(study)
    assert results[2].aborted and results[2].feasible
    best = best_trial(study)
    assert best is not None and best.number == 1
    assert 2 not in {e.trial.number for e in remeasure_candidates(study, 3)}
    assert 2 not in {r.number for r in pareto_front(study)}
    # Its partial (aborted) estimate is not a measurement; a full re-measurement is.
    _remeasure(study, 2, 1, 1200.0)
    (aborted,) = [e for e in config_estimates(study) if e.trial.number == 2]
    assert aborted.n == 1 and aborted.mean == 1200.0
    best = best_trial(study)
    assert best is not None and best.number == 2


def test_a_failed_re_measurement_excludes_the_configuration(tmp_path: Path) -> None:
    study = make_study(tmp_path, [TrialSpec(throughput=700.0), TrialSpec(throughput=900.0)])
    _remeasure(study, 1, 1, 0.0, feasible=False, failure="crashed", reason="decode died")
    (flaky,) = [e for e in config_estimates(study) if e.trial.number == 1]
    assert flaky.flaky is not None and "crashed" in flaky.flaky and not flaky.eligible
    best = best_trial(study)
    assert best is not None and best.number == 0


def test_re_measurements_are_not_trials(tmp_path: Path) -> None:
    study = make_study(tmp_path, [TrialSpec(throughput=700.0)])
    _remeasure(study, 0, 1, 720.0)
    _remeasure(study, 0, 2, 690.0)
    assert len(load_results(study)) == 1
    assert [(m.of, m.repeat) for m in load_remeasurements(study)] == [(0, 1), (0, 2)]
    study.set_user_attr(remeasure_key(0, 3), "garbage")  # not a record: ignored
    study.set_user_attr(remeasure_key(0, 4), {"repeat": 4})
    with pytest.raises(StorageError, match="remeasure:0:4"):
        load_remeasurements(study)


def test_a_bound_below_zero_does_not_rank_the_slower_configuration_first() -> None:
    """Seen on a real vLLM on 2 busy cores: one re-measured pair 5x apart made the pooled
    noise larger than every estimate; left negative, the lower bound of the slower trial was
    the least negative, and it won. Bounds are floored at 0 and the means decide."""
    from autotune.results import ConfigEstimate

    def est(mean: float, half: float, number: int) -> ConfigEstimate:
        trial = TrialResult(number=number, state="COMPLETE", values=[mean], feasible=True)
        return ConfigEstimate(trial=trial, measurements=[], n=1, mean=mean, half_width=half)

    fast, slow = est(4573.0, 38000.0, 2), est(1934.0, 23480.0, 3)
    assert fast.lower == slow.lower == 0.0
    study = optuna.create_study(direction="maximize")
    with pytest.MonkeyPatch.context() as mp:
        # where best_estimate looks it up (the facade only re-exports it)
        mp.setattr(results._ranking, "config_estimates", lambda _study: [slow, fast])
        assert results.best_estimate(study) is fast
