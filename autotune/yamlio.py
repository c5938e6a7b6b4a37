"""Reading YAML files (search spaces, deployments, studies) with errors naming file and field.

One dialect for every file: safe and YAML-1.2-like: only ``true``/``false`` are booleans
(``off`` stays the string ``off``), ``1e-3`` is a float, and a duplicate key is an error
instead of silently winning. Only regular files up to :data:`MAX_FILE_BYTES` are read, and a
NUL anywhere in a document is refused (no argv, environment or path can carry one).

:func:`validation_error_to_config_error` is the one translation of a pydantic error into a
:class:`ConfigError` (file, dotted field path, allowed values) for every file format; and
:func:`one_line` keeps any such error on one line whatever the user's text contains.
"""

from __future__ import annotations

import difflib
import re
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, Tag, ValidationError

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


def read_text(path: Path) -> str:
    """The UTF-8 text of ``path``, read as every file autotune is given is read: only a
    regular file (/dev/zero never ends, a FIFO blocks the open until someone writes to it),
    at most :data:`MAX_FILE_BYTES`; anything else is a :class:`ConfigError` naming the file."""
    try:
        mode = path.stat().st_mode
        if stat.S_ISDIR(mode):
            raise ConfigError("cannot read the file: it is a directory", file=str(path))
        if not stat.S_ISREG(mode):
            raise ConfigError(
                "cannot read the file: not a regular file (a device, pipe or socket)",
                file=str(path),
            )
        with path.open("rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read the file: {exc.strerror or exc}", file=str(path)) from None
    except ValueError as exc:  # a NUL byte in the path
        raise ConfigError(f"cannot read the file: {exc}", file=repr(str(path))) from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"file larger than {MAX_FILE_BYTES} bytes", file=str(path))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"not UTF-8 text ({exc.reason} at byte {exc.start})", file=str(path)
        ) from None


def read_yaml(path: Path) -> object:
    """The YAML document in ``path`` (read by :func:`read_text`); syntax errors name the
    line and column."""
    text = read_text(path)
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = exc.problem or exc.context or "invalid YAML"
        raise ConfigError(f"YAML syntax error{where}: {problem}", file=str(path)) from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow (NUL, ...)
        line = text.count("\n", 0, exc.position) + 1
        char = chr(exc.character) if isinstance(exc.character, int) else str(exc.character)
        raise ConfigError(
            f"YAML error at line {line}: character {char!r} is not allowed "
            "(control characters cannot appear in a YAML file)",
            file=str(path),
        ) from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"YAML error: {first}", file=str(path)) from None
    nul = _find_nul(data)
    if nul is not None:
        raise ConfigError(
            "contains a NUL character (\\x00), which no command line, environment variable "
            "or path can carry",
            file=str(path),
            field=join_field(nul) or None,
        )
    return data


def _find_nul(data: object) -> list[Part] | None:
    """The location of the first string (value or key) holding a NUL, if any."""
    stack: list[tuple[object, list[Part]]] = [(data, [])]
    seen: set[int] = set()
    while stack:
        node, at = stack.pop()
        if isinstance(node, str):
            if "\x00" in node:
                return at
        elif isinstance(node, (dict, list)) and id(node) not in seen:  # aliases may loop
            seen.add(id(node))
            if isinstance(node, dict):
                for key, value in node.items():
                    if isinstance(key, str) and "\x00" in key:
                        return at
                    stack.append((value, [*at, key if isinstance(key, (str, int)) else str(key)]))
            else:
                stack.extend((v, [*at, i]) for i, v in enumerate(node))
    return None


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


# --------------------------------------------------------------------- pydantic errors
Part = str | int
Worded = tuple[str, "list[Any] | None", list[Part]]
"""(message, allowed values, field path) of one pydantic error."""
Explain = Callable[[Mapping[str, Any], list[Part]], "Worded | None"]
"""A model's own wording for an error (error, field path), or None for the generic one."""

_EXPECTED = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "int_parsing_size": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "list_type": "a list",
    "tuple_type": "a list",
    "set_type": "a list",
    "path_type": "a path (a string)",
    "none_required": "nothing (null)",
    "finite_number": "a finite number",
}
_BOUNDS = (
    "greater_than",
    "greater_than_equal",
    "less_than",
    "less_than_equal",
    "multiple_of",
    "string_pattern_mismatch",
    "string_too_short",
    "string_too_long",
)


def _unwrap(node: Any) -> Any:
    """``Annotated[X, ...]`` -> X and ``X | None`` -> X (pydantic adds no label for either)."""
    while True:
        if get_origin(node) is Annotated:
            node = get_args(node)[0]
            continue
        if _is_union(node):
            rest = [a for a in get_args(node) if a is not type(None)]
            if len(rest) == 1:
                node = rest[0]
                continue
        return node


def _is_union(node: Any) -> bool:
    return get_origin(node) in (Union, UnionType)


def _label(branch: Any) -> set[str]:
    """The names pydantic puts into an error location for one union branch."""
    labels: set[str] = set()
    if get_origin(branch) is Annotated:
        labels |= {m.tag for m in get_args(branch)[1:] if isinstance(m, Tag)}
    base = _unwrap(branch)
    if get_origin(base) is Literal:
        labels.add("literal[" + ",".join(repr(a) for a in get_args(base)) + "]")
    elif isinstance(base, type):
        labels.add(base.__name__)
        if issubclass(base, BaseModel):  # a discriminated union labels a branch by its tag
            for info in base.model_fields.values():
                if get_origin(info.annotation) is Literal:
                    labels |= {str(a) for a in get_args(info.annotation)}
    return labels


def _walk(model: Any, loc: Sequence[Part]) -> tuple[list[Part], Any, Any, bool]:
    """Follow ``loc`` through the model's annotations.

    Returns the field path without pydantic's union-branch labels (``int``,
    ``literal['auto']``, discriminator tags), the model that holds the last part (for the
    fields an "unknown field" may be), the annotation at the location, and whether a model on
    the way hides its inputs (``hide_input_in_errors``: values are not echoed).
    """
    parts: list[Part] = []
    node: Any = model
    holder: Any = None
    hidden = False
    for part in loc:
        node = _unwrap(node)
        if _is_union(node):
            branch = next((b for b in get_args(node) if str(part) in _label(b)), None)
            if branch is not None:
                node = branch
                continue
            if isinstance(part, str) and "[" in part:  # a label we could not match
                continue
            node = None
        if part == "[key]":  # pydantic's marker of an invalid mapping key
            continue
        holder = node
        nxt: Any = None
        if isinstance(node, type) and issubclass(node, BaseModel):
            hidden = hidden or bool(node.model_config.get("hide_input_in_errors"))
            info = node.model_fields.get(str(part))
            nxt = info.annotation if info is not None else None
        elif get_origin(node) in (dict, Mapping) and len(get_args(node)) == 2:
            nxt = get_args(node)[1]
        elif get_origin(node) in (list, tuple, set, Sequence) and get_args(node):
            nxt = get_args(node)[0]
        parts.append(part)
        node = nxt
    return parts, _unwrap(holder), node, hidden


_PLAIN_KEY = re.compile(r"^[\w@:/+-][\w@:/+.-]*$")


def join_field(parts: Sequence[Part]) -> str:
    """``services.router.depends_on[0]``: dotted names, list indices in brackets, and a key
    that is not a plain word as ``env['A B']`` (a newline or quote stays on one line)."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        elif not _PLAIN_KEY.fullmatch(part) or (not text and part.startswith("-")):
            text += f"[{part!r}]"
        else:
            text += f".{part}" if text else part
    return text


def short(value: object) -> str:
    """``repr(value)``, cut to 60 characters (a fuzzed value may be a whole document)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe(value: object) -> str:
    """``int 8``, ``str 'abc'``, ``list [1, 2]``: a short type-and-value for messages."""
    return f"{type(value).__name__} {short(value)}"


def _split_expected(expected: object) -> list[str]:
    """pydantic's ``'a', 'b' or 'c'`` as ``['a', 'b', 'c']``."""
    text = str(expected).replace(" or ", ",")
    return [e.strip().strip("'") for e in text.split(",") if e.strip()]


def _message(error: Mapping[str, Any], parts: list[Part], holder: Any, hidden: bool) -> Worded:
    kind = str(error.get("type", ""))
    ctx = error.get("ctx") or {}
    value = error.get("input")
    got = "" if hidden else f", got {describe(value)}"
    name = str(parts[-1]) if parts else ""
    if kind == "extra_forbidden":
        fields = (
            list(holder.model_fields)
            if isinstance(holder, type) and issubclass(holder, BaseModel)
            else []
        )
        hint = difflib.get_close_matches(name, fields, n=1)
        message = f"unknown field {name!r}" + (f" (did you mean '{hint[0]}'?)" if hint else "")
        return message, fields or None, parts
    if kind == "missing":
        return f"required field {name!r} is missing", None, parts
    if kind == "invalid_key":
        return f"a key must be a string, got {describe(value)} (quote it in YAML)", None, parts
    if kind in ("literal_error", "enum"):
        shown = "" if hidden else f" {short(value)}"
        return f"invalid value{shown}", _split_expected(ctx.get("expected", "")), parts
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        allowed = _split_expected(ctx["expected_tags"]) if "expected_tags" in ctx else None
        if kind == "union_tag_invalid":
            return f"unknown {ctx.get('discriminator', 'kind')} {ctx.get('tag')!r}", allowed, parts
        return "cannot tell which kind of entry this is", allowed, parts
    if kind in _EXPECTED:
        message = f"expected {_EXPECTED[kind]}{got}"
        if kind == "string_type" and isinstance(value, (bool, int, float)) and not hidden:
            message += " (quote it in YAML)"
        return message, None, parts
    if kind == "too_short":
        if ctx.get("min_length") == 1:
            return "must not be empty (at least 1 item)", None, parts
        return str(error.get("msg", "too short")), None, parts
    if kind in _BOUNDS:
        message = str(error.get("msg", "invalid value")).replace("Input should", "must")
        return message.replace("String should", "must") + got, None, parts
    # Custom errors (PydanticCustomError) phrase their own message; ``allowed`` and
    # ``field`` in their context name the closed set and the sub-field.
    allowed = ctx.get("allowed")
    if ctx.get("field") is not None:
        parts = [*parts, str(ctx["field"])]
    message = str(error.get("msg", "invalid value"))
    if kind in ("value_error", "assertion_error"):  # a model validator's own sentence
        message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    return message, list(allowed) if allowed is not None else None, parts


def validation_error_to_config_error(
    exc: ValidationError,
    *,
    file: str | None,
    model: type[BaseModel] | None = None,
    prefix: Sequence[Part] = (),
    explain: Explain | None = None,
) -> ConfigError:
    """The one translation of a pydantic error into a :class:`ConfigError`.

    The first problem (an unknown field first: it usually explains a "missing" one, a typo)
    becomes one line naming ``file``, the dotted field path (``prefix`` + the location
    without pydantic's union labels) and, for closed sets, the allowed values (literal
    choices, the fields of the mapping for an unknown field, a custom error's
    ``allowed``). ``model`` is what was validated (for the field names and union labels);
    ``explain`` lets a model word its own errors. pydantic's raw report is never shown.
    """
    errors = sorted(exc.errors(include_url=False), key=lambda e: e["type"] != "extra_forbidden")
    error = errors[0]
    loc = [p for p in error.get("loc", ()) if isinstance(p, (str, int))]
    parts, holder, _, hidden = _walk(model, loc)
    found = explain(error, parts) if explain is not None else None
    message, allowed, parts = found or _message(error, parts, holder, hidden)
    if len(errors) > 1:
        more = len(errors) - 1
        message += f" (and {more} more problem{'s' if more > 1 else ''})"
    field = join_field([*prefix, *parts])
    return ConfigError(message, file=file, field=field or None, allowed=allowed)


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def escape_controls(text: str) -> str:
    """``text`` with control characters written as escapes (``\\n``, ``\\x00``)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def one_line(exc: ConfigError) -> ConfigError:
    """``exc`` with control characters (a newline in a name or value the user wrote)
    escaped in message, field and allowed values: an error is always one line."""
    parts = [exc.message, exc.file or "", exc.field or "", *map(str, exc.allowed or ())]
    if not any(_CONTROL.search(p) for p in parts):
        return exc
    allowed = exc.allowed
    if allowed is not None:
        allowed = [escape_controls(a) if isinstance(a, str) else a for a in allowed]
    return ConfigError(
        escape_controls(exc.message),
        file=escape_controls(exc.file) if exc.file else exc.file,
        field=escape_controls(exc.field) if exc.field else exc.field,
        allowed=allowed,
    )


@contextmanager
def one_line_errors() -> Iterator[None]:
    """Re-raise a :class:`ConfigError` from the block as :func:`one_line` makes it."""
    try:
        yield
    except ConfigError as exc:
        tidy = one_line(exc)
        if tidy is exc:
            raise
        raise tidy from None


def load_model(path: Path, model: type[M], *, extra: dict[str, Any] | None = None) -> M:
    """Load ``path`` into ``model``; every failure is a :class:`ConfigError`."""
    data = read_yaml_mapping(path)
    if extra:
        data = {**data, **extra}
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = validation_error_to_config_error(exc, file=str(path), model=model)
        raise one_line(error) from None
