"""Reading a search-space file: YAML, structure (pydantic), semantics, baseline.

Every problem becomes one :class:`ConfigError` naming the file, the field path and the
allowed values; pydantic's own report is translated, never shown raw. The YAML dialect is
safe and YAML-1.2-like: only ``true``/``false`` are booleans (``off`` stays the string
``off``), ``1e-3`` is a float, and a duplicate key is an error instead of silently winning.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from autotune.engines import ENGINES
from autotune.errors import ConfigError
from autotune.space.checks import compile_space
from autotune.space.model import MODEL_FIELDS, PARAM_TYPES, TARGET_KINDS, SpaceFile
from autotune.space.searchspace import SearchSpace
from autotune.yamlio import (
    Part,
    Worded,
    describe,
    one_line_errors,
    read_yaml,
    validation_error_to_config_error,
)

SMOKE_CONFIGS = 16
"""Seeded random configurations every expression is evaluated on while loading."""

# --------------------------------------------------------------------------- pydantic errors


def _explain(error: Mapping[str, Any], parts: list[Part]) -> Worded | None:
    """The space's own wording for a parameter or target of unknown kind (the generic
    translation in :mod:`autotune.yamlio` does the rest)."""
    kind = error.get("type", "")
    if kind not in ("union_tag_invalid", "union_tag_not_found"):
        return None
    value = error.get("input")
    if not isinstance(value, dict):
        return f"expected a mapping, got {describe(value)}", None, parts
    if parts[:1] == ["parameters"] and len(parts) == 2:
        if kind == "union_tag_invalid":
            tag = (error.get("ctx") or {}).get("tag")
            message = f"unknown parameter type '{tag!s}'"
        else:
            message = "missing 'type' (or 'derived: EXPRESSION' for a derived parameter)"
        return message, list(PARAM_TYPES), [*parts, "type"]
    present = [k for k in TARGET_KINDS if k in value]
    message = (
        "a target has exactly one of env, flag, switch, map"
        if present
        else "a target needs one of env, flag, switch, map"
    )
    if present:
        message += f" (found {', '.join(present)})"
    return message, list(TARGET_KINDS), parts


# --------------------------------------------------------------------------- entry points


def parse_space(data: object, *, file: str) -> SearchSpace:
    """Validate an already-parsed document (what :func:`load_space` does after YAML)."""
    with one_line_errors():
        return _parse_space(data, file=file)


def _parse_space(data: object, *, file: str) -> SearchSpace:
    if not isinstance(data, dict):
        got = "an empty file" if data is None else describe(data)
        raise ConfigError(
            f"expected a mapping with name, services, parameters, ... got {got}",
            file=file,
            allowed=list(MODEL_FIELDS["space"]),
        )
    if "allow_unknown_flags" in data:
        raise ConfigError(
            "allow_unknown_flags was replaced by the engine the space runs: "
            "engine: {name: NAME, version: VERSION} checks flags against that release's real "
            "parser; engine: {name: generic} checks only their shape",
            file=file,
            field="allow_unknown_flags",
            allowed=sorted(ENGINES),
        )
    try:
        model = SpaceFile.model_validate(data)
    except ValidationError as exc:
        raise validation_error_to_config_error(
            exc, file=file, model=SpaceFile, explain=_explain
        ) from None
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
    """Load and fully validate a search-space YAML file (and the file it ``extends``).

    Raises :class:`ConfigError` (file, field path, allowed values) for anything wrong:
    YAML syntax, unknown fields and types, ranges and steps, expressions, flags,
    services, the baseline.
    """
    file_path = Path(path)
    return parse_space(_read_extended(file_path, chain=()), file=str(file_path))


def _read_extended(path: Path, *, chain: tuple[Path, ...]) -> object:
    """The document of ``path`` with the file it ``extends`` merged under it.

    The parent is validated on its own first, so a problem in it names the parent's file;
    what is left to report against the child comes from the child's changes.
    """
    data = read_yaml(path)
    if not isinstance(data, dict) or data.get("extends") is None:
        return data
    file = str(path)
    ref = data["extends"]
    if not isinstance(ref, str) or not ref.strip():
        raise ConfigError(
            f"expected a file name (relative to this file), got {describe(ref)}",
            file=file,
            field="extends",
        )
    parent = (path.parent / ref).resolve()
    if parent in chain or parent == path.resolve():
        names = " -> ".join(repr(str(p)) for p in (*chain, path.resolve(), parent))
        raise ConfigError(f"extends forms a cycle: {names}", file=file, field="extends")
    if not parent.is_file():
        raise ConfigError(f"no space file {str(parent)!r}", file=file, field="extends")
    base = _read_extended(parent, chain=(*chain, path.resolve()))
    parse_space(base, file=str(parent))  # the parent stands on its own
    assert isinstance(base, dict)  # parse_space accepted it
    return _merge(base, data, file=file)


def _merge(base: dict[str, Any], child: dict[str, Any], *, file: str) -> dict[str, Any]:
    """``child`` over ``base``: parameters and baseline values by name (null removes a
    parameter), forbidden rules by name, every other field replaced."""
    out = {k: v for k, v in base.items() if k != "extends"}
    if "services" in child and isinstance(base.get("parameters"), dict):
        # A parent's parameter keeps applying to the parent's services when the child
        # adds some (a router): "all services of the space" meant the parent's.
        out["parameters"] = {
            name: {"services": list(base["services"]), **entry}
            if isinstance(entry, dict) and "services" not in entry
            else entry
            for name, entry in base["parameters"].items()
        }
    for key, value in child.items():
        if key == "extends":
            continue
        if key in ("parameters", "baseline") and isinstance(value, dict):
            merged = dict(out.get(key) or {})
            for name, entry in value.items():
                if entry is None and key == "parameters":
                    if name not in merged:
                        raise ConfigError(
                            f"removes parameter '{name}', which the parent does not have",
                            file=file,
                            field=f"parameters.{name}",
                            allowed=sorted(merged),
                        )
                    merged.pop(name)
                    if isinstance(out.get("baseline"), dict):
                        out["baseline"] = {k: v for k, v in out["baseline"].items() if k != name}
                else:
                    merged[name] = entry
            out[key] = merged
        elif key == "forbidden" and isinstance(value, list):
            # a name that is no string is the child's error, which parse_space names
            names = {
                n for r in value if isinstance(r, dict) and isinstance(n := r.get("name"), str)
            }
            kept = [
                r
                for r in out.get("forbidden") or []
                if not (isinstance(r, dict) and isinstance(r.get("name"), str))
                or r["name"] not in names
            ]
            out[key] = kept + value
        else:
            out[key] = value
    return out
