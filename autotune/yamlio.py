"""Reading YAML files (search spaces, deployments, studies) with errors naming file and field.

One dialect for every file: safe and YAML-1.2-like: only ``true``/``false`` are booleans
(``off`` stays the string ``off``), ``1e-3`` is a float, and a duplicate key is an error
instead of silently winning.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from autotune.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

MAX_FILE_BYTES = 1_000_000


_Base: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: ~10x


class _Loader(_Base):  # type: ignore[valid-type,misc]
    """SafeLoader with YAML 1.2 scalars and duplicate-key detection."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            try:
                duplicate = key in seen
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, "a mapping key must be a scalar", key_node.start_mark
                ) from None
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_Loader.yaml_implicit_resolvers = {
    first: [
        (tag, rx)
        for tag, rx in resolvers
        if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
    list("-+0123456789"),
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+.0123456789"),
)


def _construct_int(loader: Any, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node))
    return int(text, 0) if text[:2] in ("0o", "0x") else int(text)


def _construct_float(loader: Any, node: yaml.ScalarNode) -> float:
    text = str(loader.construct_scalar(node)).lower()
    if text.endswith(".inf"):
        return float("-inf") if text.startswith("-") else float("inf")
    if text == ".nan":
        return float("nan")
    return float(text)


_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _construct_float)


def read_yaml(path: Path) -> object:
    """The YAML document in ``path``; syntax errors name the line and column."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the file: {exc.strerror or exc}", file=str(path)) from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"file larger than {MAX_FILE_BYTES} bytes", file=str(path))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"not UTF-8 text ({exc.reason} at byte {exc.start})", file=str(path)
        ) from None
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = exc.problem or exc.context or "invalid YAML"
        raise ConfigError(f"YAML syntax error{where}: {problem}", file=str(path)) from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise ConfigError(f"YAML error: {exc}", file=str(path)) from None


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """Parse ``path`` as a YAML mapping; syntax errors carry the line number."""
    if not path.exists():
        raise ConfigError("file not found", file=str(path))
    data = read_yaml(path)
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
