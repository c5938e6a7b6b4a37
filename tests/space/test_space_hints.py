"""``hint: {value: V, strength: S}`` on a parameter: checked like every other field (file,
field path, allowed values), read back by ``SearchSpace.hints()``, shown by ``space check``,
and part of the JSON schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from space_fixtures import small, write

from autotune.errors import ConfigError
from autotune.space import load_space
from autotune.space.schema import search_space_schema
from autotune.space.summary import summarize


def _with_hint(name: str, hint: object) -> dict[str, Any]:
    data = small()
    data["parameters"][name]["hint"] = hint
    return data


@pytest.mark.parametrize(
    ("name", "hint", "field", "words", "allowed"),
    [
        ("proto", {"value": "LL128", "strength": 0.5}, "hint.value", "not one of", ["unset", "LL"]),
        ("chan", {"value": "yes", "strength": 0.5}, "hint.value", "not one of", [False, True]),
        ("mem", {"value": 0.99, "strength": 0.5}, "hint.value", "outside", ["0.7..0.95 step 0.01"]),
        ("mem", {"value": 0.805, "strength": 0.5}, "hint.value", "not on the grid", None),
        ("nmin", {"value": 64, "strength": 0.5}, "hint.value", "outside 1..32", None),
        ("nmin", {"value": 2.5, "strength": 0.5}, "hint.value", "expected an integer", None),
        ("proto", {"value": "LL", "strength": 0}, "hint.strength", "greater than 0", None),
        ("proto", {"value": "LL", "strength": 1.5}, "hint.strength", "less than or equal", None),
        ("proto", {"value": "LL"}, "hint.strength", "required field 'strength'", None),
        ("proto", {"value": "LL", "strength": 0.5, "why": "x"}, "hint.why", "unknown", None),
        ("proto", "LL", "hint", "", None),
        ("draft", {"value": 4, "strength": 1}, "hint", "unknown field 'hint'", None),
    ],
)
def test_a_bad_hint_names_the_file_the_parameter_and_the_values(
    tmp_path: Path, name: str, hint: object, field: str, words: str, allowed: list[object] | None
) -> None:
    path = write(tmp_path / "space.yaml", _with_hint(name, hint))
    with pytest.raises(ConfigError) as info:
        load_space(path)
    err = info.value
    assert err.file == str(path)
    assert err.field == f"parameters.{name}.{field}"
    assert words in err.message
    if allowed is not None:
        assert err.allowed == allowed
    if field == "hint.value":
        assert f"'{name}'" in err.message  # the parameter, by name


def test_hints_read_back_normalised_in_file_order(tmp_path: Path) -> None:
    data = small()
    data["parameters"]["mem"]["hint"] = {"value": 0.9, "strength": 0.8}
    data["parameters"]["proto"]["hint"] = {"value": "LL", "strength": 1}
    data["parameters"]["steps"]["hint"] = {"value": 2, "strength": 0.25}
    space = load_space(write(tmp_path / "space.yaml", data))
    assert space.hints() == {"proto": ("LL", 1.0), "mem": (0.9, 0.8), "steps": (2, 0.25)}
    lines = summarize(space).lines()
    assert "hints: proto='LL' (strength 1), mem=0.9 (strength 0.8), steps=2 (strength 0.25)" in (
        lines
    )
    assert "hints: none" in summarize(load_space(write(tmp_path / "s2.yaml", small()))).lines()


def test_the_schema_describes_hints() -> None:
    defs = search_space_schema()["$defs"]
    hint = defs["Hint"]
    assert hint["required"] == ["value", "strength"]
    assert hint["properties"]["strength"]["exclusiveMinimum"] == 0
    assert hint["properties"]["strength"]["maximum"] == 1
    for kind in ("CategoricalParam", "IntParam", "FloatParam", "BoolParam"):
        assert "hint" in defs[kind]["properties"]
    assert "hint" not in defs["DerivedParam"]["properties"]
