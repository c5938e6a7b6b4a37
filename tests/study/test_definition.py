from __future__ import annotations

from pathlib import Path

import pytest

from autotune.errors import ConfigError
from autotune.study.definition import load_study_definition

REPO = Path(__file__).resolve().parents[2]


def test_bundled_study_resolves_paths_relative_to_file() -> None:
    d = load_study_definition(REPO / "studies" / "dsv4-flash-sim.yaml")
    assert d.load.concurrency == 16
    assert d.resolve(d.space) == REPO / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml"
    assert d.resolve(d.deployment).exists()


@pytest.mark.parametrize(
    ("body", "field", "needle"),
    [
        (
            "name: x\nspace: a.yaml\ndeployment: b.yaml\nobjective: speed\n",
            "objective",
            "throughput_vs_tpot",
        ),
        ("name: x\nspace: a.yaml\ndeployment: b.yaml\nsampler: bogus\n", "sampler", "nsga2"),
        (
            "name: x\nspace: a.yaml\ndeployment: b.yaml\nload: {concurrency: 0}\n",
            "load.concurrency",
            "greater",
        ),
        ("name: x\nspace: a.yaml\ndeployment: b.yaml\ntypo: 1\n", "typo", "unknown field"),
        ("name: x\ndeployment: b.yaml\n", "space", "missing"),
    ],
)
def test_invalid_study_file_names_file_field_allowed(
    tmp_path: Path, body: str, field: str, needle: str
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError) as info:
        load_study_definition(path)
    text = str(info.value)
    assert str(path) in text
    assert f"field '{field}'" in text
    assert needle in text


def test_yaml_syntax_error_has_line(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("name: x\nspace: [a\n")
    with pytest.raises(ConfigError, match="YAML syntax error at line"):
        load_study_definition(path)


def test_bundled_study_measures_cheaply_and_races_its_top() -> None:
    d = load_study_definition(REPO / "studies" / "dsv4-flash-sim.yaml")
    assert d.early_abort is not None and d.early_abort.abort_below == 0.9
    assert (d.remeasure.policy, d.remeasure.race_budget) == ("race", 6)
    assert (d.remeasure.confidence, d.remeasure.indifference) == (0.95, 0.01)
    assert d.load.target_rel_ci is None and d.load.requests == 32


@pytest.mark.parametrize(
    ("body", "field", "needle"),
    [
        ("load: {duration_s: 10, target_rel_ci: 0.05}\n", "load.target_rel_ci", "exclude"),
        ("load: {min_duration_s: 100, max_duration_s: 60}\n", "load.min_duration_s", "exceeds"),
        ("load: {target_rel_ci: 1.5}\n", "load.target_rel_ci", "less than 1"),
        ("early_abort: {abort_below: 1.2}\n", "early_abort.abort_below", "less than or equal"),
        ("early_abort: {below: 0.9}\n", "early_abort.below", "unknown field"),
        ("remeasure: {top_k: -1}\n", "remeasure.top_k", "greater than or equal"),
        ("remeasure: {repeats: 50}\n", "remeasure.repeats", "less than or equal"),
        ("remeasure: {policy: best}\n", "remeasure.policy", "race, fixed"),
        ("remeasure: {budget: -1}\n", "remeasure.budget", "greater than or equal"),
        ("remeasure: {budget: 501}\n", "remeasure.budget", "less than or equal to 500"),
        ("remeasure: {budget: 2.5}\n", "remeasure.budget", "integer"),
        ("remeasure: {confidence: 1.5}\n", "remeasure.confidence", "less than or equal"),
        ("remeasure: {confidence: 0.2}\n", "remeasure.confidence", "greater than or equal"),
        ("remeasure: {indifference: -0.01}\n", "remeasure.indifference", "greater than"),
        ("remeasure: {indifference: .nan}\n", "remeasure.indifference", "finite"),
        (
            "remeasure: {policy: fixed, budget: 6}\n",
            "remeasure.budget",
            "a setting of policy: race",
        ),
        (
            "remeasure: {policy: fixed, indifference: 0.02}\n",
            "remeasure.indifference",
            "a setting of policy: race",
        ),
        ("remeasure: {budget: 6, top_k: 3}\n", "remeasure.top_k", "only sizes the race's"),
        ("remeasure: {budget: 6, repeats: 2}\n", "remeasure.repeats", "only sizes the race's"),
    ],
)
def test_measurement_settings_are_checked(
    tmp_path: Path, body: str, field: str, needle: str
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("name: x\nspace: a.yaml\ndeployment: b.yaml\n" + body)
    with pytest.raises(ConfigError) as info:
        load_study_definition(path)
    text = str(info.value)
    assert f"field '{field}'" in text, text
    assert needle in text, text


def test_measurement_settings_defaults(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: x\nspace: a.yaml\ndeployment: b.yaml\nearly_abort: {}\n"
        "load: {target_rel_ci: 0.05, min_duration_s: 2}\n"
    )
    (tmp_path / "a.yaml").write_text("")
    (tmp_path / "b.yaml").write_text("")
    d = load_study_definition(path)
    assert d.early_abort is not None
    assert (d.early_abort.abort_below, d.early_abort.margin_before_ci) == (0.9, 0.5)
    assert (d.remeasure.top_k, d.remeasure.repeats) == (3, 1)
    assert (d.load.target_rel_ci, d.load.min_duration_s) == (0.05, 2.0)


@pytest.mark.parametrize(
    ("body", "policy", "budget", "enabled"),
    [
        ("", "race", 3, True),  # the race, sized like the old top-3 x 1
        ("remeasure: {top_k: 5, repeats: 2}\n", "race", 10, True),
        ("remeasure: {budget: 8, confidence: 0.9, indifference: 0.02}\n", "race", 8, True),
        ("remeasure: {budget: 0}\n", "race", 0, False),
        ("remeasure: {top_k: 0}\n", "race", 0, False),
        ("remeasure: {policy: fixed, top_k: 2, repeats: 3}\n", "fixed", 6, True),
        ("remeasure: {policy: fixed, repeats: 0}\n", "fixed", 0, False),
    ],
)
def test_remeasure_policy_and_budget(
    tmp_path: Path, body: str, policy: str, budget: int, enabled: bool
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("name: x\nspace: a.yaml\ndeployment: b.yaml\n" + body)
    (tmp_path / "a.yaml").write_text("")
    (tmp_path / "b.yaml").write_text("")
    r = load_study_definition(path).remeasure
    assert r.policy == policy and r.enabled is enabled
    assert (r.race_budget if policy == "race" else r.top_k * r.repeats) == budget
