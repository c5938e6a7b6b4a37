"""Reading a search-space file: YAML, structure (pydantic), semantics, baseline.

Every problem becomes one :class:`ConfigError` naming the file, the field path and the
allowed values; pydantic's own report is translated, never shown raw. The YAML dialect is
safe and YAML-1.2-like: only ``true``/``false`` are booleans (``off`` stays the string
``off``), ``1e-3`` is a float, and a duplicate key is an error instead of silently winning.
"""

from __future__ import annotations

import difflib
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from autotune.errors import ConfigError
from autotune.space.checks import compile_space
from autotune.space.model import MODEL_FIELDS, PARAM_TYPES, TARGET_KINDS, SpaceFile
from autotune.space.searchspace import SearchSpace
from autotune.yamlio import read_yaml

SMOKE_CONFIGS = 16
"""Seeded random configurations every expression is evaluated on while loading."""

# --------------------------------------------------------------------------- pydantic errors

_KINDS = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "list_type": "a list",
}


def _path(loc: Sequence[str | int]) -> tuple[list[str | int], str]:
    """Field path without pydantic's union tags, and the model that holds its last part."""
    parts = list(loc)
    param_tag = target_tag = ""
    if parts[:1] == ["parameters"] and len(parts) > 2 and parts[2] in (*PARAM_TYPES, "derived"):
        param_tag = str(parts.pop(2))
        if len(parts) > 3 and parts[2] == "target" and parts[3] in TARGET_KINDS:
            target_tag = str(parts.pop(3))
    holder = parts[:-1]
    context = ""
    if not holder:
        context = "space"
    elif holder[0] == "parameters" and len(holder) == 2:
        context = f"param:{param_tag}"
    elif holder[0] == "parameters" and holder[2:] == ["target"]:
        context = f"target:{target_tag}"
    elif holder[0] == "parameters" and holder[2:4] == ["target", "map"] and len(holder) == 5:
        context = "map_entry"
    elif holder[0] == "forbidden" and len(holder) == 2:
        context = "forbidden"
    return parts, context


def _join(parts: Sequence[str | int]) -> str:
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def _describe(value: object) -> str:
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _translate(error: Any, file: str) -> ConfigError:
    loc = tuple(error.get("loc", ()))
    kind = error.get("type", "")
    ctx = error.get("ctx") or {}
    value = error.get("input")
    parts, context = _path(loc)
    allowed: list[str] | None = None
    if kind == "extra_forbidden":
        name = str(parts[-1])
        fields = list(MODEL_FIELDS.get(context, ()))
        hint = difflib.get_close_matches(name, fields, n=1)
        message = f"unknown field '{name}'" + (f" (did you mean '{hint[0]}'?)" if hint else "")
        allowed = fields or None
    elif kind == "missing":
        message = f"required field '{parts[-1]}' is missing"
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        is_param = parts[:1] == ["parameters"] and len(parts) == 2
        if not isinstance(value, dict):
            message = f"expected a mapping, got {_describe(value)}"
        elif is_param:
            allowed = list(PARAM_TYPES)
            parts = [*parts, "type"]
            if kind == "union_tag_invalid":
                message = f"unknown parameter type '{ctx.get('tag')!s}'"
            else:
                message = "missing 'type' (or 'derived: EXPRESSION' for a derived parameter)"
        else:
            allowed = list(TARGET_KINDS)
            present = [k for k in TARGET_KINDS if k in value]
            message = (
                "a target has exactly one of env, flag, switch, map"
                if present
                else "a target needs one of env, flag, switch, map"
            )
            if present:
                message += f" (found {', '.join(present)})"
    elif kind == "literal_error":
        message = f"invalid value {value!r}"
        expected = str(ctx.get("expected", ""))
        allowed = [e.strip().strip("'") for e in expected.replace(" or ", ",").split(",") if e]
    elif kind in _KINDS:
        message = f"expected {_KINDS[kind]}, got {_describe(value)}"
        if kind == "string_type" and isinstance(value, (bool, int, float)):
            message += " (quote it in YAML)"
    elif kind == "too_short":
        message = "must not be empty"
    elif kind in ("scalar_type", "condition_type"):
        message = str(error.get("msg", "invalid value"))
    else:
        message = str(error.get("msg", "invalid value"))
    return ConfigError(message, file=file, field=_join(parts) or None, allowed=allowed)


def _convert(exc: ValidationError, file: str) -> ConfigError:
    # An unknown field usually explains a missing one (a typo): report it first.
    errors = sorted(exc.errors(include_url=False), key=lambda e: e["type"] != "extra_forbidden")
    first = _translate(errors[0], file)
    if len(errors) > 1:
        more = len(errors) - 1
        return ConfigError(
            f"{first.message} (and {more} more problem{'s' if more > 1 else ''})",
            file=file,
            field=first.field,
            allowed=first.allowed,
        )
    return first


# --------------------------------------------------------------------------- entry points


def parse_space(data: object, *, file: str) -> SearchSpace:
    """Validate an already-parsed document (what :func:`load_space` does after YAML)."""
    if not isinstance(data, dict):
        got = "an empty file" if data is None else _describe(data)
        raise ConfigError(
            f"expected a mapping with name, services, parameters, ... got {got}",
            file=file,
            allowed=list(MODEL_FIELDS["space"]),
        )
    try:
        model = SpaceFile.model_validate(data)
    except ValidationError as exc:
        raise _convert(exc, file) from None
    params, rules = compile_space(model, file=file)
    space = SearchSpace(model=model, params=params, rules=rules, file=file)
    if model.baseline is not None:
        baseline = space.baseline_config()
        hits = space.violations(baseline)
        if hits:
            raise ConfigError(
                f"the baseline hits forbidden rule {hits[0]}", file=file, field="baseline"
            )
    rng = random.Random(0)
    for _ in range(SMOKE_CONFIGS):
        space.violations(space.random_config(rng))
    return space


def load_space(path: str | Path) -> SearchSpace:
    """Load and fully validate a search-space YAML file.

    Raises :class:`ConfigError` (file, field path, allowed values) for anything wrong:
    YAML syntax, unknown fields and types, ranges and steps, expressions, flags,
    services, the baseline.
    """
    file_path = Path(path)
    return parse_space(read_yaml(file_path), file=str(file_path))
