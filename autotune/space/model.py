"""The search-space file format as pydantic models (structure only).

Format in brief (``search_spaces/dsv4-flash-rtx6000-pd.yaml`` is the worked example)::

    name: my-space
    services: [prefill, decode]          # services this space may touch
    engine: {name: sglang, version: "0.5.23"}   # whose real parser checks the flags
    parameters:                          # declaration order matters
      p: {type: categorical, choices: [a, b], target: {env: X, unset_value: a}}
      n: {type: int, low: 1, high: 32, log: true, when: "p == 'b'", target: {flag: --n}}
      f: {type: float, low: 0.7, high: 0.95, step: 0.01, target: {flag: --f}}
      s: {type: bool, services: [decode], target: {switch: --disable-s, present_when: false}}
      m: {type: categorical, choices: [x, y], target: {map: {x: {flags: {--a: 1}}, y: {}}}}
      d: {derived: "n + 1", target: {flag: --d}}
      h: {type: int, low: 1, high: 8, hint: {value: 4, strength: 0.8}, target: {flag: --h}}
    forbidden:
      - {name: rule, when: "n > 16 and p == 'b'", reason: why}
    baseline: {p: a, f: 0.88, s: true, m: x}   # every parameter active under it

Semantics: a parameter is active when its ``when`` (expression or ``{param: value or
[values]}``) holds; a condition mentioning an inactive parameter is false; a derived
parameter is active when its ``when`` holds and everything it mentions is active. A
parameter owns what its target mentions: when active its value decides it (``env``: the
value as text, ``unset_value`` removes the variable, bools use ``true_value``/
``false_value`` = "1"/"0"; ``flag``: ``--flag value``, bools "true"/"false"; ``switch``:
present when the bool equals ``present_when``, removed otherwise; ``map``: the choice's
flags/switches/env are set and whatever other choices set is removed); when inactive
everything it owns is removed. YAML is read with 1.2 scalars (``off`` is a string). A
sampled parameter may carry a ``hint`` (a value its author expects to be good and how sure
they are): the default sampler tries it early (:mod:`autotune.study.hints`).

These models check shapes and types; everything that needs more than one field at a time
(ranges, steps, expressions, services, flags, baseline) is checked by
:mod:`autotune.space.checks`, which can name the exact field and the allowed values. The JSON
schema (:mod:`autotune.space.schema`) is generated from these models, so the descriptions
here are what an editor shows.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PlainValidator,
    Tag,
    WithJsonSchema,
    field_validator,
)
from pydantic_core import PydanticCustomError

from autotune.engines import FLAG_PATTERN, EngineRef

NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
"""Parameter names are identifiers so that expressions can refer to them."""
ENV_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
SERVICE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"

PARAM_TYPES = ("categorical", "int", "float", "bool")
TARGET_KINDS = ("env", "flag", "switch", "map")


def choice_key(value: object) -> str:
    """Canonical text of a choice: YAML spelling for booleans, ``str`` otherwise.

    Used for map keys (YAML keys may be ints or booleans) and to compare choices without
    Python's ``True == 1``.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _scalar(value: object) -> bool | int | float | str:
    if isinstance(value, (bool, int, float, str)):
        return value
    raise PydanticCustomError(
        "scalar_type",
        "expected a string, number or true/false, got {kind}",
        {"kind": type(value).__name__},
    )


Value = bool | int | float | str
"""A parameter value: what a configuration maps names to."""

Scalar = Annotated[
    bool | int | float | str,
    PlainValidator(_scalar),
    WithJsonSchema({"type": ["string", "number", "boolean"]}),
]
"""A YAML scalar value (a choice, a flag value, a baseline value)."""


def _condition(value: object) -> str | dict[str, Any]:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
        for item in value.values():
            items = item if isinstance(item, list) else [item]
            if not items or not all(isinstance(i, (bool, int, float, str)) for i in items):
                break
        else:
            return value
    raise PydanticCustomError(
        "condition_type",
        "expected an expression string or a non-empty mapping {parameter: value or [values]}",
    )


_SCALAR_SCHEMA = {"type": ["string", "number", "boolean"]}
Condition = Annotated[
    str | dict[str, Any],
    PlainValidator(_condition),
    WithJsonSchema(
        {
            "description": 'An expression over earlier parameters (e.g. "speculative == '
            "'eagle'\") or a mapping {parameter: value or [values]} whose entries must all "
            "hold. A condition that mentions an inactive parameter is false.",
            "oneOf": [
                {"type": "string", "minLength": 1},
                {
                    "type": "object",
                    "minProperties": 1,
                    "additionalProperties": {
                        "oneOf": [
                            _SCALAR_SCHEMA,
                            {"type": "array", "minItems": 1, "items": _SCALAR_SCHEMA},
                        ]
                    },
                },
            ],
        }
    ),
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# --------------------------------------------------------------------------- targets


class EnvTarget(_Model):
    """The value goes into an environment variable of the service."""

    env: str = Field(
        description="Variable name, e.g. NCCL_PROTO.",
        json_schema_extra={"pattern": ENV_PATTERN},
    )
    unset_value: Scalar | None = Field(
        default=None,
        description="Categorical choice that means 'variable removed' (e.g. unset).",
    )
    true_value: str = Field(default="1", description="Value for true (bool parameters).")
    false_value: str = Field(default="0", description="Value for false (bool parameters).")


class FlagTarget(_Model):
    """The value goes after a long flag: ``--flag value``."""

    flag: str = Field(
        description="Long flag, never an abbreviation.",
        json_schema_extra={"pattern": FLAG_PATTERN},
    )
    unset_value: Scalar | None = Field(
        default=None,
        description="Categorical choice that means 'flag removed' (server default).",
    )
    true_value: str = Field(default="true", description="Value for true (bool parameters).")
    false_value: str = Field(default="false", description="Value for false (bool parameters).")


class SwitchTarget(_Model):
    """A flag without a value, present when the bool equals ``present_when``."""

    switch: str = Field(
        description="Long flag without a value, e.g. --disable-custom-all-reduce.",
        json_schema_extra={"pattern": FLAG_PATTERN},
    )
    present_when: bool = Field(
        default=True,
        description="The switch is present when the parameter equals this; otherwise it is "
        "removed from the base command.",
    )


class MapEntry(_Model):
    """What one choice sets. Whatever another choice of the same parameter sets and this one
    does not is removed (flags) or unset (environment)."""

    flags: dict[str, Scalar | list[Scalar]] = Field(
        default_factory=dict,
        description="Flags with values: {--model-path: /models/x}; a list gives a flag that "
        "takes several values (nargs '+'): {--cuda-graph-bs-decode: [1, 2, 4, 8]}.",
        json_schema_extra={"propertyNames": {"pattern": FLAG_PATTERN}},
    )
    switches: list[str] = Field(
        default_factory=list,
        description="Flags without values to add.",
        json_schema_extra={"items": {"type": "string", "pattern": FLAG_PATTERN}},
    )
    remove_flags: list[str] = Field(
        default_factory=list,
        description="Flags to remove from the base command.",
        json_schema_extra={"items": {"type": "string", "pattern": FLAG_PATTERN}},
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables to set.",
        json_schema_extra={"propertyNames": {"pattern": ENV_PATTERN}},
    )
    unset_env: list[str] = Field(
        default_factory=list,
        description="Environment variables to remove.",
        json_schema_extra={"items": {"type": "string", "pattern": ENV_PATTERN}},
    )


class MapTarget(_Model):
    """Each choice maps to several flags, switches and environment variables."""

    map: dict[str, MapEntry] = Field(
        description="One entry per choice (every choice needs one; {} sets nothing).",
        min_length=1,
    )

    @field_validator("map", mode="before")
    @classmethod
    def _keys_as_text(cls, value: object) -> object:
        """YAML keys may be ints or booleans (``8:``, ``true:``); compare them as text."""
        if isinstance(value, dict):
            return {choice_key(k): v for k, v in value.items()}
        return value


def _target_tag(value: object) -> str | None:
    if isinstance(value, dict):
        kinds = [kind for kind in TARGET_KINDS if kind in value]
        return kinds[0] if len(kinds) == 1 else None
    for kind, cls in _TARGET_CLASSES.items():
        if isinstance(value, cls):
            return kind
    return None


def target_kind(target: EnvTarget | FlagTarget | SwitchTarget | MapTarget) -> str:
    """The YAML key a parsed target was written with (``flag``, ``env``, ...)."""
    return next(kind for kind, cls in _TARGET_CLASSES.items() if isinstance(target, cls))


_TARGET_CLASSES: dict[str, type[_Model]] = {
    "env": EnvTarget,
    "flag": FlagTarget,
    "switch": SwitchTarget,
    "map": MapTarget,
}

Target = Annotated[
    Annotated[EnvTarget, Tag("env")]
    | Annotated[FlagTarget, Tag("flag")]
    | Annotated[SwitchTarget, Tag("switch")]
    | Annotated[MapTarget, Tag("map")],
    Discriminator(_target_tag),
]

# --------------------------------------------------------------------------- parameters


class _ParamBase(_Model):
    description: str = Field(default="", description="Why the lever matters (cite sources).")
    services: list[str] | None = Field(
        default=None,
        description="Services this parameter applies to (default: all services of the space).",
    )
    when: Condition | None = Field(
        default=None,
        description="Active only when this holds; inactive parameters are not sampled.",
    )
    target: Target | None = Field(
        default=None,
        description="Where the value goes; none = the parameter only gates others.",
    )


class Hint(_Model):
    """A value the space's author expects to be good, and how sure they are of it."""

    value: Scalar = Field(
        description="A valid value of the parameter: one of its choices, or a number inside "
        "low..high on its step."
    )
    strength: float = Field(
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="How sure the author is, in (0, 1]: the share of the sampler's start-up "
        "trials that take the hint (the rest draw from the whole range); one early trial "
        "takes every hint at once, so a wrong hint costs about one trial.",
    )


class _SampledBase(_ParamBase):
    hint: Hint | None = Field(
        default=None,
        description="A value to try early: {value: V, strength: S} with S in (0, 1].",
    )
    default: Scalar | None = Field(
        default=None,
        description="The engine's own value when the lever is not set (its flag absent). "
        "`autotune explain` reverts a lever the baseline leaves inactive to it, and a winner "
        "whose value equals it changed nothing there. A flag's or environment variable's "
        "unset_value serves when this is not given.",
    )


class CategoricalParam(_SampledBase):
    """One of a list of values (strings, ints, floats or booleans)."""

    type: Literal["categorical"]
    choices: list[Scalar] = Field(min_length=1, description="The values, in a fixed order.")


class IntParam(_SampledBase):
    """An integer in [low, high], on a step grid or log-uniform."""

    type: Literal["int"]
    low: int
    high: int
    step: int | None = Field(default=None, description="Grid step (default 1); not with log.")
    log: bool = Field(default=False, description="Sample log-uniformly (low must be > 0).")


class FloatParam(_SampledBase):
    """A real number in [low, high], continuous, on a step grid, or log-uniform."""

    type: Literal["float"]
    low: float
    high: float
    step: float | None = Field(default=None, description="Grid step; must divide the range.")
    log: bool = Field(default=False, description="Sample log-uniformly (low must be > 0).")


class BoolParam(_SampledBase):
    """true or false."""

    type: Literal["bool"]


class DerivedParam(_ParamBase):
    """Computed from earlier parameters, never sampled (e.g. draft tokens = steps + 1)."""

    derived: str = Field(
        description="Expression over earlier parameters: names, constants, comparisons, "
        "and/or/not, in, + - * // %, min/max/abs."
    )


SampledParam = CategoricalParam | IntParam | FloatParam | BoolParam
AnyParam = SampledParam | DerivedParam


def _param_tag(value: object) -> str | None:
    if isinstance(value, dict):
        if "derived" in value:
            return "derived"
        kind = value.get("type")
        if kind is None:
            return None
        return kind if isinstance(kind, str) else repr(kind)
    for tag, cls in _PARAM_CLASSES.items():
        if isinstance(value, cls):
            return tag
    return None


_PARAM_CLASSES: dict[str, type[_ParamBase]] = {
    "categorical": CategoricalParam,
    "int": IntParam,
    "float": FloatParam,
    "bool": BoolParam,
    "derived": DerivedParam,
}

Param = Annotated[
    Annotated[CategoricalParam, Tag("categorical")]
    | Annotated[IntParam, Tag("int")]
    | Annotated[FloatParam, Tag("float")]
    | Annotated[BoolParam, Tag("bool")]
    | Annotated[DerivedParam, Tag("derived")],
    Discriminator(_param_tag),
]

# --------------------------------------------------------------------------- the file


class ForbiddenRule(_Model):
    """A combination that must never be launched (it would crash or be wrong)."""

    name: str = Field(description="Short identifier, reported with the violation.")
    when: Condition = Field(
        description="The combination; mentions of inactive parameters make the rule not apply."
    )
    reason: str = Field(description="Why it is forbidden (cite the source).")


class SpaceFile(_Model):
    """A declarative search space: parameters, their targets, constraints, the baseline."""

    extends: str | None = Field(
        default=None,
        description="A space file (relative to this one) this space starts from: its "
        "parameters, rules and baseline, with this file's added or replacing them by name "
        "(a parameter set to null is removed); other fields given here replace the parent's. "
        "The parent must be a valid space on its own.",
    )
    name: str = Field(json_schema_extra={"pattern": SERVICE_PATTERN})
    description: str = ""
    services: list[str] = Field(
        min_length=1,
        description="Services this space may touch (names of the deployment's services).",
        json_schema_extra={"items": {"type": "string", "pattern": SERVICE_PATTERN}},
    )
    engine: EngineRef = Field(
        default_factory=lambda: EngineRef(name="sglang"),
        description="The engine the space's services run and the release whose real parser "
        "(a manifest generated from it) checks every flag, value and variable; "
        "name 'generic' checks only the flag shape. Default: sglang at its pinned release.",
    )
    service_engines: dict[str, EngineRef] = Field(
        default_factory=dict,
        description="Services that run another engine than `engine`, by name (a router: "
        "{name: sglang-router, version: 0.3.2}); their levers are checked against it.",
    )
    parameters: dict[str, Param] = Field(
        min_length=1,
        description="Parameters in declaration order; conditions and derived expressions may "
        "only refer to earlier ones.",
        json_schema_extra={"propertyNames": {"pattern": NAME_PATTERN}},
    )
    forbidden: list[ForbiddenRule] = Field(default_factory=list)
    baseline: dict[str, Scalar] | None = Field(
        default=None,
        description="The deployment as it runs today: a value for every parameter active under "
        "it (derived ones may be given and must match).",
    )


MODEL_FIELDS: dict[str, tuple[str, ...]] = {
    "space": tuple(SpaceFile.model_fields),
    "forbidden": tuple(ForbiddenRule.model_fields),
    "map_entry": tuple(MapEntry.model_fields),
    **{f"param:{tag}": tuple(cls.model_fields) for tag, cls in _PARAM_CLASSES.items()},
    **{f"target:{tag}": tuple(cls.model_fields) for tag, cls in _TARGET_CLASSES.items()},
}
"""Field names by context, for 'unknown field' errors that list what is allowed."""
