"""``extends:``: a space that starts from another (the two-node space adds router levers to
the one-node one), and ``service_engines:``: levers on a service that runs another engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from space_fixtures import BUNDLED, ROOT

from autotune.errors import ConfigError
from autotune.space import load_space

TWO_NODE = ROOT / "search_spaces" / "dsv4-flash-rtx6000-pd-2node.yaml"

PARENT: dict[str, Any] = {
    "name": "parent",
    "services": ["prefill", "decode"],
    "parameters": {
        "mem": {
            "type": "float",
            "low": 0.7,
            "high": 0.95,
            "step": 0.01,
            "target": {"flag": "--mem-fraction-static"},
        },
        "steps": {
            "type": "int",
            "low": 1,
            "high": 4,
            "target": {"flag": "--speculative-num-steps"},
        },
        "chunk": {
            "type": "categorical",
            "choices": [4096, 8192],
            "services": ["prefill"],
            "target": {"flag": "--chunked-prefill-size"},
        },
    },
    "forbidden": [{"name": "tight", "when": "mem > 0.9 and steps > 3", "reason": "OOM"}],
    "baseline": {"mem": 0.88, "steps": 3, "chunk": 8192},
}


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _child(tmp_path: Path, **fields: Any) -> Path:
    _write(tmp_path / "parent.yaml", PARENT)
    return _write(tmp_path / "child.yaml", {"extends": "parent.yaml", **fields})


def test_child_adds_replaces_and_removes_parameters(tmp_path: Path) -> None:
    path = _child(
        tmp_path,
        name="child",
        parameters={
            "steps": {
                "type": "int",
                "low": 1,
                "high": 2,
                "target": {"flag": "--speculative-num-steps"},
            },
            "chunk": None,
            "overlap": {"type": "bool", "target": {"switch": "--disable-overlap-schedule"}},
        },
        baseline={"steps": 2, "overlap": False},
        forbidden=[{"name": "tight", "when": "mem > 0.9 and steps > 1", "reason": "OOM"}],
    )
    space = load_space(path)
    assert space.name == "child"
    assert [p.name for p in space.params] == ["mem", "steps", "overlap"]  # parent order first
    assert space.parameter("steps").spec.high == 2  # type: ignore[union-attr]
    assert dict(space.baseline_params()) == {"mem": 0.88, "steps": 2, "overlap": False}
    assert [r.name for r in space.rules] == ["tight"]  # replaced by name, not doubled
    assert space.violations(space.complete({"mem": 0.95, "steps": 2, "overlap": True}))


def test_parent_levers_keep_the_parents_services_when_the_child_adds_one(
    tmp_path: Path,
) -> None:
    path = _child(
        tmp_path,
        services=["prefill", "decode", "router"],
        service_engines={"router": {"name": "sglang-router", "version": "0.3.2"}},
        parameters={
            "policy": {
                "type": "categorical",
                "choices": ["cache_aware", "round_robin"],
                "services": ["router"],
                "target": {"flag": "--decode-policy"},
            }
        },
        baseline={"policy": "cache_aware"},
    )
    space = load_space(path)
    assert space.parameter("mem").services == ("prefill", "decode")
    assert space.parameter("chunk").services == ("prefill",)
    config = space.complete({"mem": 0.8, "steps": 2, "chunk": 4096, "policy": "round_robin"})
    assert space.settings_for("router", config).flags == {"--decode-policy": "round_robin"}
    assert "--mem-fraction-static" in space.settings_for("decode", config).flags


def test_the_router_lever_is_checked_by_the_routers_parser(tmp_path: Path) -> None:
    bad_choice = {
        "type": "categorical",
        "choices": ["cache_aware", "bucket"],  # a prefill-only policy
        "services": ["router"],
        "target": {"flag": "--decode-policy"},
    }
    path = _child(
        tmp_path,
        services=["prefill", "decode", "router"],
        service_engines={"router": {"name": "sglang-router"}},
        parameters={"policy": bad_choice},
        baseline={"policy": "cache_aware"},
    )
    with pytest.raises(ConfigError) as info:
        load_space(path)
    assert info.value.file == str(path)
    assert info.value.field == "parameters.policy.target.flag"
    assert "round_robin" in (info.value.allowed or []), str(info.value)
    # Without service_engines the router would be read as SGLang, which has no such option.
    path = _child(
        tmp_path,
        services=["prefill", "decode", "router"],
        parameters={"policy": {**bad_choice, "choices": ["cache_aware"]}},
        baseline={"policy": "cache_aware"},
    )
    with pytest.raises(ConfigError, match="--decode-policy"):
        load_space(path)


def test_service_engines_names_a_service_of_the_space(tmp_path: Path) -> None:
    path = _child(tmp_path, service_engines={"routr": {"name": "sglang-router"}})
    with pytest.raises(ConfigError) as info:
        load_space(path)
    assert info.value.field == "service_engines.routr"
    assert info.value.allowed == ["prefill", "decode"]


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"parameters": {"nope": None}}, "parameters.nope", "which the parent does not have"),
        ({"extends": "missing.yaml"}, "extends", "no space file"),
        ({"extends": 3}, "extends", "expected a file name"),
        ({"extends": "child.yaml"}, "extends", "cycle"),
    ],
)
def test_bad_extends_is_one_clear_error(
    tmp_path: Path, fields: dict[str, Any], field: str, message: str
) -> None:
    path = _child(tmp_path, **fields)
    with pytest.raises(ConfigError, match=message) as info:
        load_space(path)
    assert info.value.file == str(path)
    assert info.value.field == field
    assert "\n" not in str(info.value)


def test_a_broken_parent_names_the_parents_file(tmp_path: Path) -> None:
    parent = _write(tmp_path / "parent.yaml", {**PARENT, "baseline": {"mem": 2.0}})
    child = _write(tmp_path / "child.yaml", {"extends": "parent.yaml", "name": "child"})
    with pytest.raises(ConfigError) as info:
        load_space(child)
    assert info.value.file == str(parent.resolve())


def test_a_cycle_through_two_files(tmp_path: Path) -> None:
    _write(tmp_path / "a.yaml", {"extends": "b.yaml", "name": "a"})
    _write(tmp_path / "b.yaml", {"extends": "a.yaml", "name": "b"})
    with pytest.raises(ConfigError, match=r"cycle: .*a\.yaml' -> .*b\.yaml' -> .*a\.yaml"):
        load_space(tmp_path / "a.yaml")


def test_bundled_two_node_space_is_the_one_node_space_plus_router_policies() -> None:
    one, two = load_space(BUNDLED), load_space(TWO_NODE)
    assert [p.name for p in two.params] == [
        *(p.name for p in one.params),
        "router_prefill_policy",
        "router_decode_policy",
    ]
    for p in one.params:
        assert two.parameter(p.name).services == p.services, p.name
    assert dict(two.baseline_params()) == {
        **one.baseline_params(),
        "router_prefill_policy": "cache_aware",
        "router_decode_policy": "cache_aware",
    }
    assert two.engine_ref("router").name == "sglang-router"
    assert two.engine_ref("decode") == one.engine_ref("decode")


def test_a_forbidden_rule_named_by_a_list_is_a_clear_error_not_a_crash(tmp_path: Path) -> None:
    # found by the space-file fuzzer: the merge put the child's rule names in a set
    path = _child(tmp_path, forbidden=[{"name": ["accept_new_host_key"], "when": "x == 1"}])
    with pytest.raises(ConfigError) as caught:
        load_space(path)
    assert "forbidden" in str(caught.value)
