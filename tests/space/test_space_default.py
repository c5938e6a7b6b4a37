"""``default: V`` on a sampled parameter (the engine's own value when the lever is not set):
checked like a hint's value (file, field path, allowed values), read back as
``ParamInfo.engine_default`` (falling back to a flag's ``unset_value``), and part of the JSON
schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from space_fixtures import ROOT, small, write

from autotune.errors import ConfigError
from autotune.space import SearchSpace, load_space
from autotune.space.schema import search_space_schema


def _with_default(name: str, default: object) -> dict[str, Any]:
    data = small()
    data["parameters"][name]["default"] = default
    return data


def _defaults(space: SearchSpace) -> dict[str, object]:
    return {p.name: p.engine_default for p in space.sampled_params}


@pytest.mark.parametrize(
    ("name", "default", "words", "allowed"),
    [
        ("proto", "LL128", "'LL128' is not one of the choices", ["unset", "LL"]),
        ("chan", "yes", "'yes' is not one of the choices", [False, True]),
        ("mem", 0.99, "0.99 is outside 0.7..0.95 step 0.01", ["0.7..0.95 step 0.01"]),
        ("mem", 0.805, "not on the grid", ["0.7..0.95 step 0.01"]),
        ("nmin", 64, "64 is outside 1..32 (log)", ["1..32 (log)"]),
        ("steps", 2.5, "expected an integer, got 2.5", ["1..4"]),
    ],
)
def test_a_default_that_is_not_a_value_names_the_field_and_the_values(
    tmp_path: Path, name: str, default: object, words: str, allowed: list[object]
) -> None:
    path = write(tmp_path / "space.yaml", _with_default(name, default))
    with pytest.raises(ConfigError) as info:
        load_space(path)
    err = info.value
    assert err.file == str(path)
    assert err.field == f"parameters.{name}.default"
    assert err.message.startswith(f"the default is not a value of '{name}': ")
    assert words in err.message
    assert err.allowed == allowed


def test_a_derived_value_has_no_default(tmp_path: Path) -> None:
    path = write(tmp_path / "space.yaml", _with_default("draft", 3))
    with pytest.raises(ConfigError) as info:
        load_space(path)
    assert info.value.field == "parameters.draft.default"
    assert "unknown field 'default'" in info.value.message


@pytest.mark.parametrize(
    ("name", "default", "expected"),
    [
        ("proto", "LL", "LL"),
        ("chan", False, False),
        ("nmin", 4, 4),
        ("mem", 0.9, 0.9),
        ("steps", 3, 3),  # on a lever with a `when:`, the usual case
    ],
)
def test_a_valid_default_loads_and_is_the_engine_default(
    tmp_path: Path, name: str, default: object, expected: object
) -> None:
    space = load_space(write(tmp_path / "space.yaml", _with_default(name, default)))
    defaults = _defaults(space)
    assert defaults.pop(name) == expected
    assert type(space.parameter(name).engine_default) is type(expected)
    # nothing else has one but proto, whose environment variable's unset_value is its default
    assert defaults.pop("proto", "unset") == "unset"
    assert set(defaults.values()) == {None}


def test_engine_default_prefers_default_then_a_flags_unset_value(tmp_path: Path) -> None:
    data = {**small(), "engine": {"name": "generic"}}  # made-up flags: not checked
    params = data["parameters"]
    params["attn"] = {
        "type": "categorical",
        "choices": ["auto", "sdpa", "eager"],
        "target": {"flag": "--attn", "unset_value": "auto"},
    }
    params["dtype"] = {
        "type": "categorical",
        "choices": ["auto", "bf16"],
        "default": "bf16",  # given: it wins over the flag's unset_value
        "target": {"flag": "--dtype", "unset_value": "auto"},
    }
    params["bs"] = {"type": "int", "low": 1, "high": 64, "target": {"flag": "--bs"}}
    data["baseline"] = {**data["baseline"], "attn": "sdpa", "dtype": "auto", "bs": 8}
    space = load_space(write(tmp_path / "space.yaml", data))
    assert space.parameter("attn").engine_default == "auto"
    assert space.parameter("dtype").engine_default == "bf16"
    assert space.parameter("bs").engine_default is None  # a flag without unset_value
    assert space.parameter("proto").engine_default == "unset"  # an env target's unset_value
    assert space.parameter("draft").engine_default is None  # derived


def test_the_bundled_transformers_serve_space_states_its_defaults() -> None:
    space = load_space(ROOT / "search_spaces" / "transformers-serve.yaml")
    assert {k: v for k, v in _defaults(space).items() if v is not None} == {
        "attn_implementation": "default",  # unset_value
        "dtype": "auto",  # unset_value
        "cb_cuda_graph": False,
        "cb_block_size": 256,
        "cb_kv_manual": False,
        "cb_max_batch_tokens": "auto",  # unset_value
    }


def test_the_schema_describes_default() -> None:
    defs = search_space_schema()["$defs"]
    for kind in ("CategoricalParam", "IntParam", "FloatParam", "BoolParam"):
        prop = defs[kind]["properties"]["default"]
        assert "engine's own value" in prop["description"]
        assert "default" not in defs[kind].get("required", [])
    assert "default" not in defs["DerivedParam"]["properties"]
