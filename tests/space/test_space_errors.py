"""Every invalid file gives one ConfigError naming the file, the field path and the allowed
values where there is a closed set."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from space_fixtures import small, write

from autotune.errors import ConfigError
from autotune.space import load_space

Mutation = Callable[[dict[str, Any]], object]
PARAM_NAMES = ["proto", "chan", "nmin", "mem", "spec", "steps", "draft"]


def _set(path: str, value: object) -> Mutation:
    """Set a dotted path (``parameters.mem.step``) in the space dict."""

    def mutate(data: dict[str, Any]) -> object:
        *parents, last = path.split(".")
        node: Any = data
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
        return data

    return mutate


def _delete(path: str) -> Mutation:
    def mutate(data: dict[str, Any]) -> object:
        *parents, last = path.split(".")
        node: Any = data
        for part in parents:
            node = node[part]
        del node[last]
        return data

    return mutate


def _many(*mutations: Mutation) -> Mutation:
    def mutate(data: dict[str, Any]) -> object:
        for m in mutations:
            m(data)
        return data

    return mutate


# (id, mutation, expected field, substrings of the message, expected allowed values subset)
CASES: list[tuple[str, Mutation, str | None, list[str], list[str]]] = [
    (
        "unknown type",
        _set("parameters.proto.type", "enum"),
        "parameters.proto.type",
        ["unknown parameter type 'enum'"],
        ["categorical", "int", "float", "bool"],
    ),
    (
        "missing type",
        _delete("parameters.proto.type"),
        "parameters.proto.type",
        ["missing 'type'"],
        ["categorical", "int", "float", "bool"],
    ),
    (
        "typo field",
        _many(_delete("parameters.proto.choices"), _set("parameters.proto.choises", ["a"])),
        "parameters.proto.choises",
        ["unknown field 'choises'", "did you mean 'choices'"],
        ["choices", "target", "when"],
    ),
    (
        "missing choices",
        _delete("parameters.proto.choices"),
        "parameters.proto.choices",
        ["required field 'choices' is missing"],
        [],
    ),
    (
        "empty choices",
        _set("parameters.proto.choices", []),
        "parameters.proto.choices",
        ["must not be empty"],
        [],
    ),
    (
        "duplicate choice",
        _set("parameters.proto.choices", ["unset", "LL", "LL"]),
        "parameters.proto.choices[2]",
        ["duplicates"],
        [],
    ),
    (
        "string for int",
        _set("parameters.steps.low", "1"),
        "parameters.steps.low",
        ["expected an integer", "str '1'"],
        [],
    ),
    (
        "low >= high",
        _set("parameters.steps.low", 4),
        "parameters.steps.low",
        ["low (4) must be below high (4)"],
        [],
    ),
    (
        "step does not divide",
        _set("parameters.mem.step", 0.03),
        "parameters.mem.step",
        ["step 0.03 does not divide the range 0.7..0.95"],
        [],
    ),
    (
        "int step does not divide",
        _set("parameters.steps.step", 2),
        "parameters.steps.step",
        ["does not divide"],
        [],
    ),
    (
        "log with step",
        _set("parameters.nmin.step", 1),
        "parameters.nmin.step",
        ["step cannot be combined with log"],
        [],
    ),
    (
        "log with low <= 0",
        _set("parameters.nmin.low", 0),
        "parameters.nmin.low",
        ["log: true needs low > 0"],
        [],
    ),
    (
        "nan bound",
        _set("parameters.mem.high", float("nan")),
        "parameters.mem.high",
        ["finite"],
        [],
    ),
    (
        "baseline out of range",
        _set("baseline.mem", 0.99),
        "baseline.mem",
        ["0.99 is outside 0.7..0.95"],
        [],
    ),
    (
        "baseline off grid",
        _set("baseline.mem", 0.885),
        "baseline.mem",
        ["not on the grid"],
        [],
    ),
    (
        "baseline bad choice",
        _set("baseline.proto", "LL64"),
        "baseline.proto",
        ["'LL64' is not one of the choices"],
        ["unset", "LL"],
    ),
    (
        "baseline bool for int",
        _set("baseline.steps", True),
        "baseline.steps",
        ["expected an integer"],
        [],
    ),
    (
        "baseline missing",
        _delete("baseline.spec"),
        "baseline.spec",
        ["missing a value for active parameter 'spec'"],
        [],
    ),
    (
        "baseline inactive",
        _set("baseline.nmin", 4),
        "baseline.nmin",
        ["inactive", "'chan' is false"],
        [],
    ),
    (
        "baseline unknown",
        _set("baseline.zzz", 4),
        "baseline.zzz",
        ["unknown parameter 'zzz'"],
        PARAM_NAMES,
    ),
    (
        "baseline wrong derived",
        _set("baseline.draft", 7),
        "baseline.draft",
        ["given as 7 but derived as 4"],
        [],
    ),
    (
        "baseline hits forbidden",
        _many(_set("baseline.chan", True), _set("baseline.nmin", 32)),
        "baseline",
        ["forbidden rule too_many"],
        [],
    ),
    (
        "derived unknown name",
        _set("parameters.draft.derived", "stepz + 1"),
        "parameters.draft.derived",
        ["unknown name 'stepz'"],
        PARAM_NAMES,
    ),
    (
        "when refers to later",
        _set("parameters.nmin.when", "spec == 'eagle'"),
        "parameters.nmin.when",
        ["refers to 'spec', which is declared later"],
        ["proto", "chan"],
    ),
    (
        "when refers to itself",
        _set("parameters.steps.when", "steps > 1"),
        "parameters.steps.when",
        ["refers to itself"],
        [],
    ),
    (
        "conditional cycle",
        _many(_set("parameters.chan.when", "nmin > 2")),
        "parameters.chan.when",
        ["conditional cycle: chan -> nmin -> chan"],
        [],
    ),
    (
        "when unknown name",
        _set("parameters.steps.when", "speculative == 'eagle'"),
        "parameters.steps.when",
        ["unknown name 'speculative'"],
        PARAM_NAMES,
    ),
    (
        "when mapping bad value",
        _set("parameters.steps.when", {"spec": "eagel"}),
        "parameters.steps.when.spec",
        ["'eagel' is not one of the choices"],
        ["off", "eagle"],
    ),
    (
        "when literal typo",
        _set("parameters.steps.when", "spec == 'eagel'"),
        "parameters.steps.when",
        ["'eagel' is not a value of 'spec'"],
        ["off", "eagle"],
    ),
    (
        "when not boolean",
        _set("parameters.steps.when", "mem + 1"),
        "parameters.steps.when",
        ["must be true or false"],
        [],
    ),
    (
        "when type error",
        _set("parameters.steps.when", "spec < 3"),
        "parameters.steps.when",
        ["cannot order 'eagle' and 3"],
        [],
    ),
    (
        "when attribute access",
        _set("parameters.steps.when", "spec.upper() == 'EAGLE'"),
        "parameters.steps.when",
        ["not allowed"],
        [],
    ),
    (
        "service not in space",
        _set("parameters.spec.services", ["decoder"]),
        "parameters.spec.services[0]",
        ["'decoder' is not a service of this space"],
        ["prefill", "decode"],
    ),
    (
        "duplicate space service",
        _set("services", ["prefill", "prefill"]),
        "services[1]",
        ["listed twice"],
        [],
    ),
    (
        "flag abbreviation",
        _set("parameters.steps.target", {"flag": "--tp"}),
        "parameters.steps.target.flag",
        ["--tp is an abbreviation of --tp-size"],
        ["--tp-size"],
    ),
    (
        "prefix of two flags",
        _set("parameters.steps.target", {"flag": "--speculative-num"}),
        "parameters.steps.target.flag",
        ["ambiguous option --speculative-num"],
        ["--speculative-num-steps", "--speculative-num-draft-tokens"],
    ),
    (
        "unknown flag",
        _set("parameters.mem.target.flag", "--mem-fraction-statc"),
        "parameters.mem.target.flag",
        ["unknown option --mem-fraction-statc in sglang 0.5.23"],
        ["--mem-fraction-static"],
    ),
    (
        "flag removed in 0.5.20, now an ambiguous prefix",
        _set("parameters.mem.target.flag", "--cuda-graph-max-bs"),
        "parameters.mem.target.flag",
        ["ambiguous option --cuda-graph-max-bs in sglang 0.5.23"],
        ["--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"],
    ),
    (
        "variable the engine does not read",
        _set("parameters.proto.target.env", "SGLANG_SM120_FLASHMLA_BACKEN"),
        "parameters.proto.target.env",
        ["SGLANG_SM120_FLASHMLA_BACKEN is not a variable sglang 0.5.23 reads"],
        ["SGLANG_SM120_FLASHMLA_BACKEND"],
    ),
    (
        "engine without a manifest of that version",
        _set("engine", {"name": "sglang", "version": "0.4.0"}),
        "engine.version",
        ["no manifest for sglang 0.4.0"],
        ["0.5.23"],
    ),
    (
        "unknown engine",
        _set("engine", {"name": "tgi"}),
        "engine.name",
        ["unknown engine 'tgi'"],
        ["sglang", "vllm", "generic"],
    ),
    (
        "allow_unknown_flags is gone",
        _set("allow_unknown_flags", True),
        "allow_unknown_flags",
        ["engine: {name: generic}"],
        ["generic"],
    ),
    (
        "short flag",
        _set("parameters.mem.target.flag", "-m"),
        "parameters.mem.target.flag",
        ["not a long-form flag"],
        [],
    ),
    (
        "flag with value",
        _set("parameters.mem.target.flag", "--mem-fraction-static=0.8"),
        "parameters.mem.target.flag",
        ["not a long-form flag"],
        [],
    ),
    (
        "map flag abbreviation",
        _set("parameters.spec.target.map.eagle.flags", {"--speculative-algo": "EAGLE"}),
        "parameters.spec.target.map.eagle.flags.--speculative-algo",
        ["abbreviation"],
        ["--speculative-algorithm"],
    ),
    (
        "switch on int",
        _set("parameters.steps.target", {"switch": "--disable-cuda-graph"}),
        "parameters.steps.target.switch",
        ["a switch needs a bool parameter"],
        [],
    ),
    (
        "map missing choice",
        _delete("parameters.spec.target.map.off"),
        "parameters.spec.target.map",
        ["no entry for choice(s) off"],
        ["off", "eagle"],
    ),
    (
        "map unknown choice",
        _set("parameters.spec.target.map.medusa", {}),
        "parameters.spec.target.map.medusa",
        ["'medusa' is not a choice"],
        ["off", "eagle"],
    ),
    (
        "map entry unknown field",
        _set("parameters.spec.target.map.eagle.flagz", {}),
        "parameters.spec.target.map.eagle.flagz",
        ["unknown field 'flagz'", "did you mean 'flags'"],
        ["flags", "switches", "env"],
    ),
    (
        "target with two kinds",
        _set("parameters.mem.target", {"flag": "--mem-fraction-static", "env": "X"}),
        "parameters.mem.target",
        ["exactly one of env, flag, switch, map"],
        ["env", "flag", "switch", "map"],
    ),
    (
        "target without kind",
        _set("parameters.mem.target", {"value": 1}),
        "parameters.mem.target",
        ["needs one of env, flag, switch, map"],
        ["env", "flag", "switch", "map"],
    ),
    (
        "target unknown field",
        _set("parameters.mem.target", {"flag": "--mem-fraction-static", "unset": "x"}),
        "parameters.mem.target.unset",
        ["unknown field 'unset'", "did you mean 'unset_value'"],
        ["flag", "unset_value"],
    ),
    (
        "unset_value not a choice",
        _set("parameters.proto.target.unset_value", "none"),
        "parameters.proto.target.unset_value",
        ["'none' is not one of the choices"],
        ["unset", "LL"],
    ),
    (
        "true_value on categorical",
        _set("parameters.proto.target.true_value", "1"),
        "parameters.proto.target.true_value",
        ["only applies to bool"],
        [],
    ),
    (
        "true_value not a string",
        _set("parameters.chan.target", {"env": "X", "true_value": 1}),
        "parameters.chan.target.true_value",
        ["expected a string", "quote it"],
        [],
    ),
    (
        "env name",
        _set("parameters.proto.target.env", "NCCL-PROTO"),
        "parameters.proto.target.env",
        ["not a valid environment variable name"],
        [],
    ),
    (
        "two parameters, one flag",
        _set("parameters.steps.target.flag", "--mem-fraction-static"),
        "parameters.steps.target.flag",
        ["flag --mem-fraction-static on service decode is already set by parameter 'mem'"],
        [],
    ),
    (
        "reserved parameter name",
        _many(
            _delete("parameters.chan"),
            _set("parameters.min", {"type": "bool"}),
            _delete("parameters.nmin"),
            _set("forbidden", []),
        ),
        "parameters.min",
        ["reserved"],
        [],
    ),
    (
        "keyword parameter name",
        _set("parameters.class", {"type": "bool"}),
        "parameters.class",
        ["must be an identifier"],
        [],
    ),
    (
        "forbidden duplicate names",
        _set(
            "forbidden",
            [
                {"name": "a", "when": "chan", "reason": "x"},
                {"name": "a", "when": "chan", "reason": "y"},
            ],
        ),
        "forbidden[1].name",
        ["used twice"],
        [],
    ),
    (
        "forbidden missing reason",
        _set("forbidden", [{"name": "a", "when": "chan"}]),
        "forbidden[0].reason",
        ["required field 'reason' is missing"],
        [],
    ),
    (
        "forbidden bad condition",
        _set("forbidden", [{"name": "a", "when": ["chan"], "reason": "x"}]),
        "forbidden[0].when",
        ["expected an expression string or a non-empty mapping"],
        [],
    ),
    (
        "forbidden call",
        _set("forbidden", [{"name": "a", "when": "open('/etc/passwd')", "reason": "x"}]),
        "forbidden[0].when",
        ["function calls other than min"],
        [],
    ),
    (
        "top-level unknown field",
        _set("paramters", {}),
        "paramters",
        ["unknown field 'paramters'", "did you mean 'parameters'"],
        ["name", "services", "parameters", "forbidden", "baseline"],
    ),
    (
        "missing services",
        _delete("services"),
        "services",
        ["required field 'services' is missing"],
        [],
    ),
    (
        "baseline list value",
        _set("baseline.proto", ["unset"]),
        "baseline.proto",
        ["expected a string, number or true/false, got list"],
        [],
    ),
    (
        "parameter is a string",
        _set("parameters.chan", "bool"),
        "parameters.chan",
        ["expected a mapping"],
        [],
    ),
]


@pytest.mark.parametrize(
    ("mutation", "field", "contains", "allowed"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_invalid_file(
    tmp_path: Path,
    mutation: Mutation,
    field: str,
    contains: list[str],
    allowed: list[str],
) -> None:
    path = write(tmp_path / "broken-space.yaml", mutation(small()))
    with pytest.raises(ConfigError) as info:
        load_space(path)
    error = info.value
    text = str(error)
    assert error.file == str(path)
    assert "broken-space.yaml" in text
    assert error.field == field, text
    assert f"field '{field}'" in text
    for part in contains:
        assert part in text, text
    if allowed:
        offered = (error.allowed or []) + (error.closest or [])
        assert offered, text
        assert set(allowed) <= {str(a) for a in offered}, text
        assert "allowed: " in text or "closest: " in text
    assert "pydantic" not in text and "Traceback" not in text and "errors.pydantic" not in text


def test_valid_small_space_loads(tmp_path: Path) -> None:
    space = load_space(write(tmp_path / "ok.yaml", small()))
    assert space.baseline_config()["draft"] == 4


def test_generic_engine_checks_only_the_shape(tmp_path: Path) -> None:
    data = small()
    data["parameters"]["mem"]["target"]["flag"] = "--gpu-memory-utilization"
    data["engine"] = {"name": "generic"}
    assert load_space(write(tmp_path / "v.yaml", data)).settings_for(
        "prefill", {"proto": "LL", "chan": False, "mem": 0.9, "spec": "off"}
    ).flags == {"--gpu-memory-utilization": "0.9"}
    data["parameters"]["mem"]["target"]["flag"] = "gpu-memory-utilization"
    with pytest.raises(ConfigError, match="not a long-form flag"):
        load_space(write(tmp_path / "v.yaml", data))


@pytest.mark.parametrize(
    ("text", "contains"),
    [
        ("name: x\nservices: [a\nparameters: {}\n", ["YAML syntax error at line"]),
        ("name: x\n  bad: indent\n", ["YAML syntax error at line 2"]),
        ("name: x\nname: y\nservices: [a]\n", ["duplicate key 'name'", "line 2"]),
        ("", ["empty file"]),
        ("- a\n- b\n", ["expected a mapping", "list"]),
        ("!!python/object:os.system {}\n", ["YAML syntax error"]),
        (
            "name: x\nservices: [a]\nparameters:\n  p: {type: bool}\n  p: {type: bool}\n",
            ["duplicate key 'p'", "line 5"],
        ),
    ],
)
def test_yaml_level_errors(tmp_path: Path, text: str, contains: list[str]) -> None:
    path = write(tmp_path / "raw.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_space(path)
    message = str(info.value)
    assert message.startswith(str(path))
    for part in contains:
        assert part in message, message


def test_missing_and_binary_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the file") as info:
        load_space(tmp_path / "nope.yaml")
    assert "nope.yaml" in str(info.value)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_space(binary)


def test_yaml_12_scalars(tmp_path: Path) -> None:
    """``off``/``no`` stay strings (the Norway problem); ``1e-3`` is a float."""
    text = (
        "name: s\nservices: [a]\nparameters:\n"
        "  mode: {type: categorical, choices: [off, on, no, yes]}\n"
        "  lr: {type: float, low: 1e-4, high: 1e-1, log: true}\n"
        "baseline: {mode: off, lr: 1e-3}\n"
    )
    space = load_space(write(tmp_path / "s.yaml", text))
    assert space.parameter("mode").choices == ("off", "on", "no", "yes")
    assert space.baseline_config() == {"mode": "off", "lr": 0.001}


def test_many_problems_are_counted(tmp_path: Path) -> None:
    data = small()
    data["parameters"]["steps"]["low"] = "1"
    data["parameters"]["steps"]["high"] = "4"
    with pytest.raises(ConfigError, match=r"\(and 1 more problem\)"):
        load_space(write(tmp_path / "m.yaml", data))
