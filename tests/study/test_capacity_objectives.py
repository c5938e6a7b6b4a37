"""Capacity and goodput objectives: what a study file may say, and what is optimized."""

from __future__ import annotations

from pathlib import Path

import pytest
from optuna.study import StudyDirection

from autotune.errors import ConfigError
from autotune.study.definition import OBJECTIVES, SLOSettings, load_study_definition
from autotune.study.objectives import FAILED_LATENCY_MS, Objective

REPO = Path(__file__).resolve().parents[2]
HEAD = "name: x\nspace: a.yaml\ndeployment: b.yaml\n"


def write(tmp_path: Path, body: str) -> Path:
    (tmp_path / "a.yaml").write_text("")
    (tmp_path / "b.yaml").write_text("")
    path = tmp_path / "s.yaml"
    path.write_text(HEAD + body)
    return path


@pytest.mark.parametrize(
    ("body", "field", "needle"),
    [
        ("objective: capacity\n", "slo", "needs a latency SLO"),
        (
            "objective: capacity\nslo: {ttft_p99_ms: 100}\nload: {request_rate: 3}\n",
            "load.request_rate",
            "the capacity search sets the request rate",
        ),
        (
            "objective: capacity\nslo: {ttft_p99_ms: 100}\ncapacity: {max_error_rate: 0.1}\n",
            "capacity.max_error_rate",
            "slo.max_error_rate",
        ),
        ("capacity: {start: 2}\n", "capacity", "the objective is 'throughput'"),
        ("objective: goodput\nslo: {ttft_p99_ms: 100}\n", "load.request_rate", "given rate"),
        ("objective: goodput\nload: {request_rate: 2}\n", "slo", "latency SLO"),
        ("load: {burstiness: 0.5}\n", "load.burstiness", "open loop"),
        ("load: {max_concurrency: 8}\n", "load.max_concurrency", "open loop"),
        (
            "objective: capacity_vs_tpot\nslo: {tpot_p99_ms: 50}\n"
            "early_abort: {abort_below: 0.9}\n",
            "early_abort",
            "throughput objective",
        ),
        ("objective: capacity_vs_e2e\n", "objective", "capacity_vs_ttft"),
        (
            "objective: capacity\nslo: {ttft_p99_ms: 1}\ncapacity: {over: rate, growth: 1}\n",
            "capacity.growth",
            "greater than 1",
        ),
        ("curve: {over: concurrency, points: [1, 2.5]}\n", "curve.points", "whole numbers"),
        ("curve: {points: []}\n", "curve.points", "at least 1"),
        ("load: {dataset: {kind: random}, input_len: 9}\n", "load.input_len", "dataset"),
        # the discriminated union's tag is not part of the field (found by the study fuzz)
        (
            "load: {dataset: {kind: shared_prefix, bogus: 1}}\n",
            "load.dataset.bogus",
            "prompts_per_group",
        ),
    ],
)
def test_bad_measurement_settings_name_the_field(
    tmp_path: Path, body: str, field: str, needle: str
) -> None:
    path = write(tmp_path, body)
    with pytest.raises(ConfigError) as info:
        load_study_definition(path)
    text = str(info.value)
    assert str(path) in text and f"field '{field}'" in text, text
    assert needle in text, text


def test_a_capacity_search_over_the_rate_may_shape_its_arrivals(tmp_path: Path) -> None:
    d = load_study_definition(
        write(
            tmp_path,
            "objective: capacity\nslo: {tpot_p99_ms: 40}\n"
            "load: {burstiness: 0.5, max_concurrency: 64}\n",
        )
    )
    search, curve = d.measure_plan()
    assert search is not None and search.over == "rate" and curve is None
    assert search.max_error_rate == d.slo.max_error_rate


def test_the_bundled_capacity_study_loads() -> None:
    d = load_study_definition(REPO / "studies" / "dsv4-flash-sim-capacity.yaml")
    assert d.objective == "capacity" and d.capacity is not None
    assert d.load.dataset is not None and d.load.dataset.kind == "shared_prefix"
    assert d.slo.ttft_p99_ms and d.slo.tpot_p99_ms


@pytest.mark.parametrize("kind", OBJECTIVES)
def test_every_objective_has_names_directions_and_failed_values(kind: str) -> None:
    objective = Objective(kind=kind, slo=SLOSettings(ttft_p99_ms=100.0))
    names, directions = objective.metric_names, objective.directions
    assert len(names) == len(directions) == len(objective.failed_values())
    assert directions[0] == StudyDirection.MAXIMIZE
    assert names[0] in {
        "output_throughput_tok_s",
        "capacity_req_s",
        "goodput_req_s",
        "output_tok_per_kj",
    }
    if "_vs_" in kind:
        assert directions[1] == StudyDirection.MINIMIZE
        assert names[1] == f"{kind.split('_vs_')[1]}_p99_ms"
        assert objective.failed_values()[1] == FAILED_LATENCY_MS


def test_values_read_the_objectives_own_figure() -> None:
    metrics = {
        "output_throughput": 900.0,
        "goodput": 3.5,
        "capacity": 7.25,
        "tpot_ms": {"p99": 21.0},
        "ttft_ms": {"p99": 640.0},
        "error_rate": 0.0,
    }
    slo = SLOSettings(ttft_p99_ms=1000.0)
    assert Objective(kind="capacity", slo=slo).values(metrics) == [7.25]
    assert Objective(kind="capacity_vs_ttft", slo=slo).values(metrics) == [7.25, 640.0]
    assert Objective(kind="goodput_vs_tpot", slo=slo).values(metrics) == [3.5, 21.0]
    assert Objective(kind="throughput_vs_ttft", slo=slo).values(metrics) == [900.0, 640.0]
    streams = Objective(kind="capacity", slo=slo, capacity_over="concurrency")
    assert streams.metric_names == ["capacity_streams"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("load: {dataset: {kind: sharegpt, path: convs.json}}\n", "load.dataset.path"),
        ("load: {tokenizer: models/tok}\n", "load.tokenizer"),
    ],
)
def test_files_the_load_names_must_exist_beside_the_study(
    tmp_path: Path, body: str, field: str
) -> None:
    path = write(tmp_path, body)
    with pytest.raises(ConfigError) as info:
        load_study_definition(path)
    assert f"field '{field}'" in str(info.value) and "relative to the study file" in str(info.value)
    (tmp_path / "convs.json").write_text("[]")
    (tmp_path / "models" / "tok").mkdir(parents=True)
    assert load_study_definition(path).load is not None


def test_the_vllm_capacity_study_is_valid() -> None:
    """Its tokenizer is the model `make vllm-cpu` builds; the rest must validate as is."""
    from autotune.study.definition import StudyDefinition
    from autotune.yamlio import load_model

    d = load_model(REPO / "studies" / "vllm-cpu-capacity.yaml", StudyDefinition)
    assert d.objective == "capacity" and d.load.tokenizer == "models/llama-tiny"
    search, _ = d.measure_plan()
    assert search is not None and search.over == "rate"
