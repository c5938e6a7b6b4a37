"""The expression language: what it evaluates and what it refuses (security)."""

from __future__ import annotations

import pytest

from autotune.errors import ConfigError
from autotune.space.expr import compile_expression, condition_source

NAMES = ["spec", "steps", "mem", "chan", "splits"]
VALUES = {"spec": "eagle", "steps": 3, "mem": 0.88, "chan": True, "splits": 8}


def _eval(source: str, values: dict[str, object] | None = None) -> object:
    expr = compile_expression(source, names=NAMES, file="s.yaml", field="parameters.x.when")
    return expr.evaluate(VALUES if values is None else values)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("steps + 1", 4),
        ("steps * 2 - 1", 5),
        ("steps // 2", 1),
        ("steps % 2", 1),
        ("-steps", -3),
        ("min(steps, 2) + max(1, steps, 7) + abs(-2)", 11),
        ("spec == 'eagle'", True),
        ("spec != 'eagle'", False),
        ("spec in ('off', 'eagle')", True),
        ("spec not in ['off']", True),
        ("1 < steps <= 3", True),
        ("1 < steps < 3", False),
        ("chan and steps > 2", True),
        ("not chan or steps > 5", False),
        ("chan == True", True),
        ("chan == 1", False),  # booleans only equal booleans
        ("splits in (1, 2, 4, 8)", True),
        ("mem >= 0.88", True),
        ("steps == 3.0", True),
    ],
)
def test_evaluates(source: str, expected: object) -> None:
    assert _eval(source) == expected


@pytest.mark.parametrize(
    ("source", "what"),
    [
        ("__import__('os').system('true')", "function calls other than min"),
        ("spec.__class__", "attribute access"),
        ("().__class__.__bases__[0].__subclasses__()", "not allowed"),
        ("spec.upper()", "not allowed"),
        ("open('/etc/passwd')", "function calls other than min"),
        ("eval('1')", "function calls other than min"),
        ("exec('import os')", "function calls other than min"),
        ("getattr(spec, 'x')", "function calls other than min"),
        ("__builtins__", "dunder"),
        ("__spec__ == 1", "dunder"),
        ("spec[0]", "subscripts"),
        ("[s for s in (1, 2)]", "comprehension"),
        ("lambda: 1", "lambda"),
        ("steps ** 1000000", "power operator"),
        ("steps / 2", "true division"),
        ("steps if chan else 1", "conditional expression"),
        ("(x := 1)", "assignment"),
        ("f'{spec}'", "f-string"),
        ("{'a': 1}", "dict literal"),
        ("{1, 2}", "set literal"),
        ("steps & 1", "bitwise"),
        ("spec is None", "'is' comparison"),
        ("None", "constant None"),
        ("b'x' == spec", "constant b'x'"),
        ("min(steps, key=abs)", "function calls other than min"),
        ("min(*NAMES)", "function calls other than min"),
        ("abs(steps, 1)", "function calls other than min"),
        ("spec in spec", "tuple or list literal"),
        ("import os", "syntax error"),
        ("steps = 1", "syntax error"),
        ("", "non-empty expression"),
    ],
)
def test_refuses(source: str, what: str) -> None:
    with pytest.raises(ConfigError) as info:
        compile_expression(source, names=NAMES, file="s.yaml", field="parameters.x.when")
    text = str(info.value)
    assert what in text, text
    assert text.startswith("s.yaml: field 'parameters.x.when': ")


def test_deep_but_short_expressions_evaluate() -> None:
    assert _eval("not " * 200 + "chan") is True
    assert _eval("(" * 150 + "steps" + ")" * 150 + " + 1") == 4


def test_deep_nesting_and_length_are_refused() -> None:
    for source in ("-" * 5000 + "1", "1 + " * 400 + "1"):
        with pytest.raises(ConfigError, match="longer than|cannot parse|nested"):
            compile_expression(source, names=NAMES, file="s.yaml", field="f")


def test_unknown_name_lists_parameters() -> None:
    with pytest.raises(ConfigError) as info:
        compile_expression("speculative == 'eagle'", names=NAMES, file="s.yaml", field="f")
    assert "unknown name 'speculative'" in str(info.value)
    assert info.value.allowed == sorted(NAMES)
    with pytest.raises(ConfigError, match="unknown name 'min'"):
        compile_expression("min == 1", names=NAMES, file="s.yaml", field="f")


@pytest.mark.parametrize(
    ("source", "values", "what"),
    [
        ("spec < 3", VALUES, "cannot order"),
        ("steps // (steps - 3)", VALUES, "by zero"),
        ("steps % 0", VALUES, "by zero"),
        ("spec + 1", VALUES, "arithmetic needs numbers"),
        ("spec * 100000000", VALUES, "arithmetic needs numbers"),
        ("chan + 1", VALUES, "arithmetic needs numbers"),
        ("steps and chan", VALUES, "needs true/false operands"),
        ("min(spec, 1)", VALUES, "min()"),
        ("-spec", VALUES, "needs a number"),
        ("steps > 1", {"spec": "off"}, "no value for 'steps'"),
    ],
)
def test_runtime_errors_are_config_errors(
    source: str, values: dict[str, object], what: str
) -> None:
    expr = compile_expression(source, names=NAMES, file="s.yaml", field="forbidden[0].when")
    with pytest.raises(ConfigError) as info:
        expr.evaluate(values)
    assert what in str(info.value)
    assert info.value.file == "s.yaml" and info.value.field == "forbidden[0].when"


def test_names_and_literal_comparisons() -> None:
    expr = compile_expression(
        "spec == 'eagle' and 'x' != chan and splits in (1, 2) and max(steps, 1) > 0",
        names=NAMES,
        file="s.yaml",
        field="f",
    )
    assert expr.names == {"spec", "chan", "splits", "steps"}
    assert sorted(expr.literal_comparisons(), key=str) == sorted(
        [("spec", ["eagle"]), ("chan", ["x"]), ("splits", [1, 2])], key=str
    )


def test_condition_source_from_mapping() -> None:
    source = condition_source({"spec": "eagle", "splits": [1, 2], "chan": True})
    assert source == "spec == 'eagle' and splits in (1, 2,) and chan == True"
    assert _eval(source) is False
    assert _eval(source, {**VALUES, "splits": 2}) is True
    tricky = condition_source({"spec": 'it\'s "quoted"'})
    assert _eval(tricky, {**VALUES, "spec": 'it\'s "quoted"'}) is True
