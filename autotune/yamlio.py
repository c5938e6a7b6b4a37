"""Reading YAML files into pydantic models with errors that name file and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from autotune.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """Parse ``path`` as a YAML mapping; syntax errors carry the line number."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("file not found", file=str(path)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read file: {exc.strerror}", file=str(path)) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"invalid YAML{where}: {problem}", file=str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"expected a mapping at the top level, got {type(data).__name__}", file=str(path)
        )
    return data


def validation_error_to_config_error(exc: ValidationError, *, file: str) -> ConfigError:
    """The first pydantic error as one readable ConfigError (file, dotted field, allowed)."""
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err.get("loc", ())) or None
    allowed = None
    ctx = err.get("ctx") or {}
    if "expected" in ctx:
        allowed = [
            s.strip().strip("'") for s in str(ctx["expected"]).replace(" or ", ",").split(",")
        ]
        allowed = [a for a in allowed if a]
    msg = str(err.get("msg", "invalid value"))
    if err.get("type") == "extra_forbidden":
        msg = "unknown field"
    if err.get("type") == "missing":
        msg = "required field is missing"
    more = len(exc.errors()) - 1
    if more:
        msg += f" (and {more} more error{'s' if more > 1 else ''})"
    return ConfigError(msg, file=file, field=field, allowed=allowed)


def load_model(path: Path, model: type[M], *, extra: dict[str, Any] | None = None) -> M:
    """Load ``path`` into ``model``; every failure is a :class:`ConfigError`."""
    data = read_yaml_mapping(path)
    if extra:
        data = {**data, **extra}
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error_to_config_error(exc, file=str(path)) from None
