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
