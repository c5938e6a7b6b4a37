"""Shared pieces of the fuzz tests: budgets, value strategies, document and file damage, and
the one property every invalid file must satisfy (one clear ConfigError).

Budgets: each property runs a CI-sized number of examples by default; the ``soak`` variant
of each test (``pytest -m soak tests/fuzz``) runs :data:`SOAK_EXAMPLES`, and
``AUTOTUNE_FUZZ_EXAMPLES=N`` overrides the default budget of every test.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import signal
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from autotune.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SOAK_EXAMPLES = 5000
EXAMPLE_LIMIT_S = 30.0
"""No example may take longer: a hang is a failure with the input, not a stuck run."""
_OVERRIDE = os.environ.get("AUTOTUNE_FUZZ_EXAMPLES")


def budget(default: int) -> int:
    """Examples for a default run (``AUTOTUNE_FUZZ_EXAMPLES`` overrides)."""
    return int(_OVERRIDE) if _OVERRIDE else default


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
    )


def properties(
    strategy: st.SearchStrategy[Any], check: Callable[[Any], None], *, examples: int
) -> tuple[Callable[..., None], Callable[..., None]]:
    """A property as two tests: the default budget, and a ``soak``-marked long one."""

    @_settings(budget(examples))
    @given(case=strategy)
    def default(case: Any) -> None:
        with time_limit(EXAMPLE_LIMIT_S):
            check(case)

    @pytest.mark.soak
    @_settings(SOAK_EXAMPLES)
    @given(case=strategy)
    def soak(case: Any) -> None:
        with time_limit(EXAMPLE_LIMIT_S):
            check(case)

    return default, soak


class Hung(Exception):
    """An example ran past its time limit (a blocking open, an endless read, ...)."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Fail (raise :class:`Hung`) instead of blocking the whole run forever."""

    def alarm(signum: int, frame: object) -> None:
        raise Hung(f"example still running after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# --------------------------------------------------------------------------- values
HOSTILE = [
    "$(touch /tmp/autotune-fuzz-canary)",
    "`id`",
    "; rm -rf /",
    "| cat",
    "&& true",
    "'\"'",
    "a\nb",
    "${IFS}",
    "${python}",
    "$${x}",
    "${nope}",
    "../../../etc/passwd",
    "/",
    "..",
    "-oProxyCommand=touch x",
    "%n",
    "\t",
    "\x00",
    "\x7f",
    "é",
    "😀",
    " ",
]
"""Strings that break naive quoting, templates, paths and unit files."""

HUGE = [
    10**30,
    -(10**30),
    2**63,
    2**31,
    -1,
    0,
    65536,
    1e308,
    -1e308,
    math.inf,
    -math.inf,
    math.nan,
    1e-320,
]
"""Numbers at and beyond every bound a file may have."""

WORDS = [
    "auto",
    "local",
    "process",
    "systemd",
    "tpe",
    "nsga2",
    "chat",
    "throughput",
    "prefill",
    "decode",
    "router",
    "127.0.0.1",
    "localhost",
    "http://${router.host}:${router.port}",
    "${host}",
    "${port}",
    "${run_dir}",
    "sglang.service",
    "--tp-size",
    "true",
    "off",
    "",
]

SCALARS: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=70000),
    st.sampled_from(HUGE),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.text(max_size=8),
    st.sampled_from(HOSTILE),
    st.sampled_from(WORDS),
)
VALUES: st.SearchStrategy[Any] = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.sampled_from(WORDS), st.text(max_size=6)), inner, max_size=3),
    ),
    max_leaves=6,
)


def _field_names() -> list[str]:
    from autotune.deployment import Deployment, HealthCheck, ServiceDef
    from autotune.remote.hosts import HostSpec
    from autotune.space.model import MODEL_FIELDS
    from autotune.study import definition as study

    models: list[type[BaseModel]] = [Deployment, ServiceDef, HealthCheck, HostSpec]
    models += [study.StudyDefinition, study.LoadSpec, study.SLOSettings]
    models += [study.CorrectnessSettings]
    names = {name for model in models for name in model.model_fields}
    names |= {name for fields in MODEL_FIELDS.values() for name in fields}
    return sorted(names)


FIELD_NAMES = _field_names()
"""Every field name of every file format: an added key is often a real, misplaced one."""

KEYS: st.SearchStrategy[str] = st.one_of(
    st.sampled_from(FIELD_NAMES),
    st.sampled_from(WORDS),
    st.sampled_from(HOSTILE),
    st.text(min_size=1, max_size=6),
)


# --------------------------------------------------------------------------- document damage
def paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every location (key/index path) in a parsed YAML document."""
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += paths(value, (*prefix, i))
    return found


OPS = 8
"""delete, replace, rename key, add key, duplicate item, same-type value (2x), wrong type."""


def mutate(data: Any, choice: int, op: int, value: object, key: str) -> Any:
    """One structural edit at the ``choice``-th location of ``data`` (in place)."""
    spots = [p for p in paths(data) if p]
    if not spots:
        return value
    path = spots[choice % len(spots)]
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    old = parent[last]
    if op == 0:  # delete
        del parent[last]
    elif op == 1:  # replace with anything
        parent[last] = value
    elif op == 2 and isinstance(parent, dict):  # rename a key
        parent[key] = parent.pop(last)
    elif op == 3 and isinstance(parent, dict):  # unknown key next to it
        parent[key] = value
    elif op == 4 and isinstance(parent, list):  # duplicate a list item
        parent.append(copy.deepcopy(old))
    elif op in (5, 6):  # same type, other value: keeps files valid, reaches the semantics
        if isinstance(old, bool):
            parent[last] = not old
        elif isinstance(old, int):
            parent[last] = HUGE[choice % len(HUGE)] if op == 6 else choice % 70000
        elif isinstance(old, float):
            parent[last] = (choice % 1000) / 100
        elif isinstance(old, str):
            parent[last] = key
        elif isinstance(old, list) and old:
            parent[last] = list(reversed(old))
    elif op == 7:  # wrong type: scalar <-> container
        parent[last] = [old] if not isinstance(old, (list, dict)) else str(old)[:20]
    else:
        parent[last] = value
    return data


MUTATIONS = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=100_000),
        st.integers(min_value=0, max_value=OPS),
        VALUES,
        KEYS,
    ),
    min_size=1,
    max_size=3,
)


def mutated_text(base: Any, edits: Sequence[tuple[int, int, object, str]]) -> str:
    data = copy.deepcopy(base)
    for choice, op, value, key in edits:
        data = mutate(data, choice, op, value, key)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


TEXT_EDITS = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=100_000),
        st.integers(min_value=0, max_value=12),
        st.text(alphabet=" \n\t:-[]{}'\"#&*!|>%@`,?0123456789abcxyz_.$\\", max_size=6),
    ),
    min_size=1,
    max_size=4,
)


def damaged_text(text: str, edits: Sequence[tuple[int, int, str]]) -> str:
    """YAML syntax damage: delete and insert characters at random places."""
    for position, delete, insert in edits:
        position %= len(text) + 1
        text = text[:position] + insert + text[position + delete :]
    return text


WHOLE_FILES: st.SearchStrategy[bytes] = st.one_of(
    st.just(b""),
    st.just(b"\xef\xbb\xbf"),
    st.just(b"\n\n# only a comment\n"),
    st.just(b"~\n"),
    st.just(b"---\n---\n"),
    st.just(b"a: 1\n" + b"x" * 1_000_001),
    st.just(b"a: &a [*a]\n"),
    st.binary(max_size=64),
    st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
    VALUES.filter(lambda v: not isinstance(v, dict)).map(
        lambda v: yaml.safe_dump(v, allow_unicode=True).encode()
    ),
    st.sampled_from(HUGE).map(lambda n: f"port: {n}\n".encode()),
)
"""Whole files that are not a document of the right shape at all."""


def _unwrap(node: Any) -> Any:
    while True:
        if get_origin(node) is Annotated:
            node = get_args(node)[0]
        elif get_origin(node) in (Union, UnionType):
            rest = [a for a in get_args(node) if a is not type(None)]
            if len(rest) != 1:
                return node
            node = rest[0]
        else:
            return node


def field_paths(model: type[BaseModel], data: Any) -> list[tuple[str, ...]]:
    """Every field a file of ``model`` may set, as key paths; under a ``name -> model``
    mapping, for the names ``data`` has (``services.prefill.health.timeout_s``)."""
    found: list[tuple[str, ...]] = []
    data = data if isinstance(data, dict) else {}
    for name, info in model.model_fields.items():
        found.append((name,))
        node = _unwrap(info.annotation)
        sub = data.get(name)
        if isinstance(node, type) and issubclass(node, BaseModel):
            found += [(name, *p) for p in field_paths(node, sub)]
        elif get_origin(node) is dict and isinstance(sub, dict):
            inner = _unwrap(get_args(node)[1])
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                for key, value in sub.items():
                    found += [(name, str(key), *p) for p in field_paths(inner, value)]
    return found


def set_field(data: Any, path: Sequence[str], value: object) -> Any:
    """``data`` with the field at ``path`` set (intermediate mappings created)."""
    node = data
    for part in path[:-1]:
        if not isinstance(node, dict):
            return data
        node = node.setdefault(part, {})
    if isinstance(node, dict):
        node[path[-1]] = value
    return data


FIELD_VALUES: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from(HUGE), st.sampled_from(HOSTILE), st.sampled_from(WORDS), SCALARS, VALUES
)
"""What a known field is set to: bounds, hostile strings, other fields' words, anything."""


@dataclass(frozen=True)
class Case:
    """One fuzzed file: which base, and how it was damaged."""

    kind: str
    base: int
    edits: tuple[Any, ...] = ()
    raw: bytes = b""


@dataclass
class Corpus:
    """The bundled files a fuzz test starts from, and the fields their format has."""

    files: list[Path]
    model: type[BaseModel] | None = None
    texts: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.texts = self.texts or [p.read_text(encoding="utf-8") for p in self.files]
        self.datas = [yaml.safe_load(t) for t in self.texts]
        self.fields = [
            field_paths(self.model, d) if self.model is not None else [] for d in self.datas
        ]

    def cases(self) -> st.SearchStrategy[Case]:
        """Structural mutations, schema-aware field values, text damage or a whole
        replacement of one of the files."""
        base = st.integers(min_value=0, max_value=len(self.files) - 1)
        kinds = [
            st.builds(Case, st.just("structure"), base, MUTATIONS.map(tuple)),
            st.builds(Case, st.just("text"), base, TEXT_EDITS.map(tuple)),
            st.builds(Case, st.just("file"), base, st.just(()), WHOLE_FILES),
        ]
        if self.model is not None:
            sets = st.lists(
                st.tuples(st.integers(min_value=0, max_value=100_000), FIELD_VALUES),
                min_size=1,
                max_size=3,
            )
            kinds.append(st.builds(Case, st.just("field"), base, sets.map(tuple)))
        return st.one_of(*kinds)

    def render(self, case: Case) -> bytes:
        if case.kind == "structure":
            text = mutated_text(self.datas[case.base], case.edits)
        elif case.kind == "field":
            data = copy.deepcopy(self.datas[case.base])
            paths = self.fields[case.base]
            for index, value in case.edits:
                data = set_field(data, paths[index % len(paths)], value)
            text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
        elif case.kind == "text":
            text = damaged_text(self.texts[case.base], case.edits)
        else:
            return case.raw
        return text.encode("utf-8", "surrogatepass")


# --------------------------------------------------------------------------- the property
def assert_clear(err: ConfigError, path: Path, *, closed: Mapping[str, Sequence[str]] = {}) -> None:
    """One clear error: names the file and the field (dotted path), lists the allowed values
    of a closed set, is one line, and shows nothing of pydantic's report."""
    text = str(err)
    assert err.file == str(path), text
    assert text.startswith(str(path)), text
    if err.field is not None:
        assert f"field '{err.field}'" in text, text
    assert "\n" not in text and "\r" not in text, text
    for junk in ("pydantic", "Traceback", "errors.pydantic.dev", "Input should", "[type="):
        assert junk not in text, text
    # The product's phrase (yamlio: "unknown field 'NAME'"), not words inside a quoted value
    # (a fuzzed comment moved into a value: "got str '... unknown fields ...'").
    if "unknown field '" in text.split(": got ", 1)[0]:
        assert err.allowed, text
    last = (err.field or "").rsplit(".", 1)[-1]
    shape = (  # about the value's type or characters, not which of the set it is
        "expected ",
        "required field",
        "unknown field",
        "must not be empty",
        "a key must",
        "contains a NUL",
        # a key of the file's own (a parameter named in `baseline:`), whatever its name: a
        # fuzzed `baseline.target` lists the space's parameters, not a target's kinds
        "unknown parameter '",
    )
    if last in closed and not err.message.startswith(shape):
        assert err.allowed or "has no" in err.message, text
        if closed[last]:  # a fixed set (empty: names the file itself defines)
            assert {str(a) for a in err.allowed or ()} <= set(closed[last]), text


def write(tmp: Path, name: str, raw: bytes) -> Path:
    path = tmp / name
    path.write_bytes(raw)
    return path
