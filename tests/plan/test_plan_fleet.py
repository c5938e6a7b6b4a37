"""The fleet plan's arithmetic on stored studies (SQLite, no servers): replicas from the
per-replica rate's lower 95% bound, GPUs, cost, J/token, the minimal winner, what is never
planned, a missing price, and the errors a user can cause."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import optuna
import pytest
from conftest_results import (
    BASELINE_PARAMS,
    TrialSpec,
    frozen_trial,
    make_study,
    metrics,
    services,
    typical_specs,
)
from e2e_helpers import autotune_cli

from autotune.errors import ConfigError
from autotune.explain import ExplainRun, Explanation, Interval, Measured, Minimal
from autotune.explain.record import RESULT_ATTR, Decision, run_key
from autotune.plan import (
    PlanSettings,
    load_settings,
    make_plan,
    parse_headroom,
    replicas_needed,
)
from autotune.results import config_estimates, remeasure_key
from autotune.telemetry import Telemetry

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

GPUS = {"sim-dsv4-flash-pd.yaml": (8, "sim-dsv4-flash-pd.yaml")}
TOKENS_PER_REQUEST = 128.0


def mem(value: float) -> dict[str, Any]:
    return {**BASELINE_PARAMS, "mem_fraction_static": value}


def capacity_trial(
    capacity: float,
    params: dict[str, Any],
    *,
    baseline: bool = False,
    attrs: dict[str, Any] | None = None,
) -> optuna.trial.FrozenTrial:
    """A capacity trial as the pipeline stores it: its value is the capacity (req/s), its
    metrics those at capacity; none passed: value 0, the SLO broken, the probes' curve."""
    ok = capacity > 0
    m = metrics(capacity * TOKENS_PER_REQUEST, 20.0 if ok else 450.0)
    m["request_throughput"] = capacity if ok else 0.1
    extra: dict[str, Any] = {
        "metrics": m,
        "capacity": {
            "over": "rate",
            "capacity": capacity,
            "upper": capacity * 1.2 if ok else 2.0,
            "stop_reason": "bracketed" if ok else "no passing load",
            "precision_reached": ok,
            "probes": 4,
        },
        "curve": [
            {"x": 2.0, "ok": False, "violations": ["tpot_p99 7.5x its limit"]},
            {"x": 4.0, "ok": False, "violations": ["tpot_p99 7.9x its limit"]},
        ]
        if not ok
        else [{"x": capacity, "ok": True, "violations": []}],
        **(attrs or {}),
    }
    spec = TrialSpec(
        throughput=capacity,
        params=params,
        is_baseline=baseline,
        slo_violation=-1.0 if ok else 390.0,
        attrs=extra,
    )
    return frozen_trial(spec, multi=False)


def remeasure(study: optuna.Study, of: int, repeat: int, capacity: float) -> None:
    study.set_user_attr(
        remeasure_key(of, repeat),
        {
            "of": of,
            "repeat": repeat,
            "values": [capacity],
            "feasible": True,
            "metrics": {"output_throughput": capacity * TOKENS_PER_REQUEST},
        },
    )


def capacity_study(tmp_path: Path) -> optuna.Study:
    """#0 the baseline (no load met the SLOs), #1 the winner (6.0 req/s over 3 runs), #2 4.0
    req/s, #3 2.5 req/s, #4 no load met the SLOs either, #5 crashed, #6 the winner's config
    again (reused: one configuration)."""
    study = make_study(tmp_path, [])
    study.set_metric_names(["capacity_req_s"])
    study.add_trials(
        [
            capacity_trial(0.0, BASELINE_PARAMS, baseline=True),
            capacity_trial(6.0, mem(0.80)),
            capacity_trial(4.0, mem(0.81)),
            capacity_trial(2.5, mem(0.82)),
            capacity_trial(0.0, mem(0.83)),
            frozen_trial(TrialSpec(failure="cuda_oom", params=mem(0.95)), multi=False),
            capacity_trial(6.0, mem(0.80), attrs={"reused_from": 1}),
        ]
    )
    remeasure(study, 1, 1, 5.6)
    remeasure(study, 1, 2, 6.4)
    return study


def test_replicas_are_counted_from_the_lower_bound_not_the_mean(tmp_path: Path) -> None:
    study = capacity_study(tmp_path)
    settings = PlanSettings(target_rate=10.0, headroom=0.2, gpu_hour_cost=3.0)
    plan = make_plan(study, settings, gpus=GPUS)
    lower = {e.trial.number: e.lower for e in config_estimates(study)}
    assert [(r.label, r.trial) for r in plan.rows] == [("winner", 1), ("#2", 2), ("#3", 3)]
    winner = plan.rows[0]
    assert winner.rate_mean == pytest.approx(6.0) and winner.measurements == 3
    assert winner.rate_lower == pytest.approx(lower[1]) and winner.rate_lower < 6.0
    # On the mean, 12 req/s would take exactly 2 replicas; its lower bound needs 3.
    assert math.ceil(12.0 / winner.rate_mean) == 2 and winner.replicas == 3
    for r in plan.rows:
        assert r.rate_lower == pytest.approx(lower[r.trial])
        assert r.replicas == math.ceil(10.0 * (1 + 0.2) / r.rate_lower)
        assert r.gpus_per_replica == 8 and r.gpus == 8 * r.replicas
        assert r.rate_per_gpu == pytest.approx(r.rate_lower / 8)
        assert r.cost_per_hour is not None and r.cost_per_hour == pytest.approx(3.0 * r.gpus)
        assert r.output_tokens_per_request == pytest.approx(TOKENS_PER_REQUEST)
        tokens_per_hour = 10.0 * TOKENS_PER_REQUEST * 3600
        assert r.cost_per_million_tokens == pytest.approx(r.cost_per_hour / tokens_per_hour * 1e6)
    assert plan.provisioned_rate == pytest.approx(12.0)
    assert [r.cheapest for r in plan.rows] == [True, False, False]
    assert plan.cheapest is winner


def test_configurations_that_meet_the_slos_at_no_rate_are_never_planned(tmp_path: Path) -> None:
    plan = make_plan(capacity_study(tmp_path), PlanSettings(target_rate=10.0), gpus=GPUS)
    planned = {r.trial for r in plan.rows}
    assert 0 not in planned and 4 not in planned and 5 not in planned
    assert [(u.label, u.trial) for u in plan.unplannable] == [("baseline", 0), ("", 4)]
    for u in plan.unplannable:
        assert u.reason == (
            "no load met the SLOs: at 2 req/s, the lowest probed, it broke tpot_p99 7.5x its limit"
        )
    assert plan.failed == {"cuda_oom": 1}
    assert 6 not in planned  # the winner's configuration again: planned once


def test_a_missing_price_omits_the_cost_columns_and_says_so_once(tmp_path: Path) -> None:
    study = capacity_study(tmp_path)
    plan = make_plan(study, PlanSettings(target_rate=10.0), gpus=GPUS)
    assert not plan.priced
    assert all(r.cost_per_hour is None and r.cost_per_million_tokens is None for r in plan.rows)
    assert all(r.gpus is not None for r in plan.rows)  # GPUs need no price
    assert [n for n in plan.notes if "--gpu-hour-cost" in n] == [
        "No --gpu-hour-cost given: the cost columns are omitted."
    ]
    url = f"sqlite:///{tmp_path / 'study.db'}"
    common = ("plan", "--study", "autotune-test", "--storage", url, "--target-rate", "10")
    out = autotune_cli(*common, cwd=tmp_path).stdout
    assert out.count("--gpu-hour-cost") == 1 and "cost" not in out.split("not planned")[0]
    assert "No --gpu-hour-cost given" in out
    priced = autotune_cli(*common, "--gpu-hour-cost", "2.5", cwd=tmp_path).stdout
    assert "cost/h" in priced and "--gpu-hour-cost" not in priced
    data = json.loads(autotune_cli(*common, "--json", cwd=tmp_path).stdout)
    assert [r["cost_per_hour"] for r in data["rows"]] == [None, None, None]
    assert [r["replicas"] for r in data["rows"]] == [r.replicas for r in plan.rows]
    # The plan is stored for the report (the last one asked for).
    stored = load_settings(optuna.load_study(study_name="autotune-test", storage=url))
    assert stored == PlanSettings(target_rate=10.0)


@pytest.mark.parametrize(
    ("provisioned", "lower", "expected"),
    [
        (12.0, 4.0, 3),
        (7.0 * (1 + 0.1), 0.77, 10),  # 7.700000000000001 / 0.77 = 10.000000000000002: 10
        (0.1 * 3, 0.1, 3),  # 3.0000000000000004 in floating point: still 3
        (12.1, 4.0, 4),
        (0.5, 4.0, 1),
        (24.0, 6.35, 4),
    ],
)
def test_replicas_needed(provisioned: float, lower: float, expected: int) -> None:
    assert replicas_needed(provisioned, lower) == expected


def test_a_throughput_study_needs_a_stated_rate_and_says_what_that_assumes(
    tmp_path: Path,
) -> None:
    study = make_study(tmp_path, typical_specs(12))
    with pytest.raises(ConfigError) as info:
        make_plan(study, PlanSettings(target_rate=5.0))
    assert info.value.field == "--per-replica-rate"
    assert "measured no capacity" in str(info.value)
    plan = make_plan(study, PlanSettings(target_rate=5.0, per_replica_rate=2.0), gpus=GPUS)
    estimates = {e.trial.number: e for e in config_estimates(study)}
    winner = estimates[plan.rows[0].trial]
    assert plan.rows[0].label == "winner" and plan.rows[0].rate_lower == pytest.approx(2.0)
    for r in plan.rows[1:]:
        e = estimates[r.trial]
        assert r.rate_mean == pytest.approx(2.0 * e.mean / winner.mean)
        assert r.replicas == math.ceil(6.0 / r.rate_lower)
    one_level = [n for n in plan.notes if "one load level" in n]
    assert len(one_level) == 1 and "--per-replica-rate 2 req/s" in one_level[0]
    assert "neither was measured" in one_level[0]
    # SLO violators at the study's one load are not planned either.
    violators = {u.trial for u in plan.unplannable}
    assert violators and not violators & {r.trial for r in plan.rows}
    assert all("at the study's one load" in u.reason for u in plan.unplannable if u.trial != 0)


def test_a_stated_rate_for_a_capacity_study_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        make_plan(capacity_study(tmp_path), PlanSettings(target_rate=5.0, per_replica_rate=2.0))
    assert info.value.field == "--per-replica-rate" and "measured each" in str(info.value)


@pytest.mark.parametrize(
    ("option", "value", "needle"),
    [
        ("target_rate", 0.0, "greater than 0"),
        ("target_rate", -3.0, "greater than 0"),
        ("target_rate", math.inf, "finite"),
        ("gpu_hour_cost", 0.0, "greater than 0"),
        ("per_replica_rate", -1.0, "greater than 0"),
        ("gpus_per_replica", 0, "greater than or equal to 1"),
        ("top", 0, "greater than or equal to 1"),
    ],
)
def test_bad_figures_name_their_option(option: str, value: float, needle: str) -> None:
    values: dict[str, Any] = {"target_rate": 10.0, option: value}
    with pytest.raises(ConfigError) as info:
        PlanSettings.from_options(**values)
    assert info.value.field == "--" + option.replace("_", "-")
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("text", "value"), [("20%", 0.2), ("0.2", 0.2), ("0", 0.0), ("150%", 1.5), ("1", 1.0)]
)
def test_headroom_is_a_fraction_or_a_percentage(text: str, value: float) -> None:
    assert parse_headroom(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["20", "-5%", "abc", "", "1e400"])
def test_a_bad_headroom_is_refused(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_headroom(text)
    assert info.value.field == "--headroom"


def test_the_cli_refuses_a_non_positive_target_and_a_study_without_capacity(
    tmp_path: Path,
) -> None:
    capacity_study(tmp_path / "cap")
    make_study(tmp_path / "thr", typical_specs(3))
    for where, args, needle in (
        ("cap", ("--target-rate", "0"), "field '--target-rate'"),
        ("cap", ("--target-rate", "5", "--headroom", "20"), "2000% headroom"),
        ("thr", ("--target-rate", "5"), "field '--per-replica-rate'"),
    ):
        url = f"sqlite:///{tmp_path / where / 'study.db'}"
        proc = autotune_cli(
            "plan", "--study", "autotune-test", "--storage", url, *args, cwd=tmp_path, check=False
        )
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert needle in proc.stderr and proc.stderr.count("\n") == 1
        assert "Traceback" not in proc.stderr


def test_the_minimal_winner_is_planned_from_its_own_runs(tmp_path: Path) -> None:
    """An explanation of the winner whose minimal winner dropped a change: planned from its
    measured mean and lower bound, beside the winner."""
    study = capacity_study(tmp_path)
    winner_params = mem(0.80)
    minimal_params = dict(BASELINE_PARAMS)

    def measured(key: str, mean: float, low: float) -> Measured:
        return Measured(
            key=key, n=2, values=[mean] * 2, mean=Interval(value=mean, low=low, high=2 * mean - low)
        )

    minimal = Minimal(
        kept=[],
        dropped=["mem_fraction_static"],
        config=minimal_params,
        measured=measured("k-min", 5.9, 5.0),
        ratio=Interval(value=0.98, low=0.9, high=1.05),
        decisions=[Decision(change="mem_fraction_static", action="dropped", why="within 3%")],
        complete=True,
    )
    expl = Explanation(
        winner=1,
        unit="req/s",
        objective="capacity",
        tolerance=0.03,
        winner_config=winner_params,
        baseline_config=dict(BASELINE_PARAMS),
        winner_measured=measured("k-win", 6.0, 5.5),
        baseline_measured=measured("k-base", 0.0, 0.0),
        minimal=minimal,
        runs=4,
        complete=True,
    )
    study.set_user_attr(RESULT_ATTR, expl.model_dump(mode="json"))
    for i in (0, 1):
        m = metrics(5.9 * 100, 20.0)
        m["request_throughput"] = 5.9
        run = ExplainRun(
            key="k-min",
            index=i,
            config={**minimal_params, "speculative_num_draft_tokens": 4},
            values=[5.9],
            feasible=True,
            metrics=m,
            services=services(minimal_params),  # type: ignore[arg-type]
        )
        study.set_user_attr(run_key("k-min", i), run.model_dump(mode="json"))
    plan = make_plan(study, PlanSettings(target_rate=10.0, gpu_hour_cost=1.0), gpus=GPUS)
    assert [r.label for r in plan.rows][:2] == ["winner", "minimal winner"]
    row = plan.rows[1]
    assert row.minimal and row.trial == 1 and row.changes == 0
    assert (row.rate_mean, row.rate_lower) == (5.9, 5.0)
    assert row.replicas == math.ceil(12.0 / 5.0) == 3
    assert row.output_tokens_per_request == pytest.approx(100.0)
    assert not any("No minimal winner" in n for n in plan.notes)


def test_joules_per_token_where_telemetry_was_recorded(tmp_path: Path) -> None:
    study = make_study(tmp_path, [])
    study.set_metric_names(["capacity_req_s"])
    measured = Telemetry(source="nvml", energy_j=4000.0, output_tokens=10_000).with_tokens(10_000)
    none = Telemetry.none("NVML not available: No module named 'pynvml'")
    study.add_trials(
        [
            capacity_trial(0.0, BASELINE_PARAMS, baseline=True),
            capacity_trial(3.0, mem(0.8), attrs={"telemetry": measured.model_dump(mode="json")}),
            capacity_trial(2.0, mem(0.9), attrs={"telemetry": none.model_dump(mode="json")}),
        ]
    )
    plan = make_plan(study, PlanSettings(target_rate=4.0), gpus=GPUS)
    assert [r.energy_per_token_j for r in plan.rows] == [pytest.approx(0.4), None]
    assert any(n.startswith("J/token: the GPUs' energy") and "every probe" in n for n in plan.notes)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    out = autotune_cli(
        "plan", "--study", "autotune-test", "--storage", url, "--target-rate", "4", cwd=tmp_path
    ).stdout
    table = out.split("note:")[0]
    assert "J/tok" in table and "│ 0.400 │" in " ".join(table.split())
    # No trial with energy: the column is absent and the reason said once.
    bare = make_plan(capacity_study(tmp_path / "bare"), PlanSettings(target_rate=4.0), gpus=GPUS)
    assert all(r.energy_per_token_j is None for r in bare.rows)
    url = f"sqlite:///{tmp_path / 'bare' / 'study.db'}"
    out = autotune_cli(
        "plan", "--study", "autotune-test", "--storage", url, "--target-rate", "4", cwd=tmp_path
    ).stdout
    assert "J/tok" not in out.split("note:")[0]
    assert sum("No J/token" in n for n in bare.notes) == 1


def test_a_concurrency_capacity_is_planned_as_its_request_rate(tmp_path: Path) -> None:
    study = make_study(tmp_path, [])
    study.set_metric_names(["capacity_streams"])
    trial = capacity_trial(16.0, mem(0.8))
    trial.user_attrs["metrics"]["request_throughput"] = 3.2  # 16 streams served 3.2 req/s
    study.add_trials([capacity_trial(0.0, BASELINE_PARAMS, baseline=True), trial])
    plan = make_plan(study, PlanSettings(target_rate=6.0, headroom=0.0), gpus=GPUS)
    assert plan.rows[0].rate_mean == pytest.approx(3.2) and plan.rows[0].replicas == 2
    assert "concurrent streams" in plan.rate_source


def test_gpus_unknown_are_said_and_can_be_given(tmp_path: Path) -> None:
    study = capacity_study(tmp_path)
    plan = make_plan(study, PlanSettings(target_rate=10.0, gpu_hour_cost=2.0), gpus={})
    assert all(r.gpus is None and r.cost_per_hour is None for r in plan.rows)
    assert any("GPUs per replica unknown" in n and "--gpus-per-replica" in n for n in plan.notes)
    given = make_plan(
        study, PlanSettings(target_rate=10.0, gpu_hour_cost=2.0, gpus_per_replica=2), gpus={}
    )
    assert [r.gpus for r in given.rows] == [2 * r.replicas for r in given.rows]
    assert given.rows[0].cost_per_hour == pytest.approx(4.0 * given.rows[0].replicas)
    assert "GPUs per replica: 2 (--gpus-per-replica)." in given.notes
    assert not any("unknown" in n for n in given.notes)


def test_a_study_with_nothing_to_plan_says_why(tmp_path: Path) -> None:
    empty = make_study(tmp_path / "empty", [])
    empty.set_metric_names(["capacity_req_s"])
    plan = make_plan(empty, PlanSettings(target_rate=1.0), gpus=GPUS)
    assert plan.rows == [] and "No trial was measured yet" in plan.notes[0]
    none_met = make_study(tmp_path / "none", [])
    none_met.set_metric_names(["capacity_req_s"])
    none_met.add_trials([capacity_trial(0.0, BASELINE_PARAMS, baseline=True)])
    plan = make_plan(none_met, PlanSettings(target_rate=1.0), gpus=GPUS)
    assert plan.rows == [] and plan.cheapest is None
    assert "No configuration met the SLOs at any rate measured" in plan.notes[0]
    assert [u.label for u in plan.unplannable] == ["baseline"]
