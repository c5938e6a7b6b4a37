"""Random mutations of a valid file give a valid space or a ConfigError, nothing else."""

from __future__ import annotations

import contextlib
import copy
import random
import tempfile
from pathlib import Path
from typing import Any

import optuna
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from space_fixtures import BUNDLED, SMALL

from autotune.errors import ConfigError
from autotune.space import SearchSpace, load_space

BUNDLED_DATA = yaml.safe_load(BUNDLED.read_text(encoding="utf-8"))
BUNDLED_TEXT = BUNDLED.read_text(encoding="utf-8")

INTERESTING = st.sampled_from(
    [
        "unset", "eagle", "off", "categorical", "int", "float", "bool", "--tp",
        "--mem-fraction-static", "--disable-cuda-graph", "speculative_num_steps + 1",
        "speculative == 'eagle'", "nccl_channels", "__import__('os')", "x.y", "a <", "",
        "steps // 0", "min(1, 'a')", "NCCL_PROTO", "decode", "prefill", "router",
    ]
)  # fmt: skip
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=300),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.text(max_size=8),
    INTERESTING,
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(INTERESTING, st.text(max_size=6)), inner, max_size=3),
    ),
    max_leaves=6,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _paths(value, (*prefix, i))
    return found


def _mutate(data: Any, choice: int, op: int, value: object, key: str) -> Any:
    paths = [p for p in _paths(data) if p]
    path = paths[choice % len(paths)]
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if op == 0:  # delete
        del parent[last]
    elif op == 1:  # replace
        parent[last] = value
    elif op == 2 and isinstance(parent, dict):  # rename a key
        parent[key] = parent.pop(last)
    elif op == 3 and isinstance(parent, dict):  # add a key next to it
        parent[key] = value
    elif op == 4 and isinstance(parent, list):  # duplicate a list item
        parent.append(copy.deepcopy(parent[last]))
    elif op in (5, 6):  # same type, other value: keeps many files valid, exercises semantics
        old = parent[last]
        if isinstance(old, bool):
            parent[last] = not old
        elif isinstance(old, int):
            parent[last] = choice % 300 - 3
        elif isinstance(old, float):
            parent[last] = (choice % 1000) / 100
        elif isinstance(old, str):
            parent[last] = key
        elif isinstance(old, list) and old:
            parent[last] = list(reversed(old))
    else:
        parent[last] = value
    return data


def _exercise(space: SearchSpace) -> None:
    """Use a loaded space the way a study would; only ConfigError may come out."""
    rng = random.Random(1)
    for _ in range(3):
        config = space.random_config(rng)
        space.violations(config)
        space.config_key(config)
        for service in (*space.services, "router"):
            space.settings_for(service, config)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    trial = study.ask()
    space.complete(space.suggest(trial))
    if space.has_baseline:
        space.baseline_params()
    space.grid()


def _load(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzzed.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            space = load_space(path)
        except ConfigError as exc:
            assert "fuzzed.yaml" in str(exc)
            return
        with contextlib.suppress(ConfigError):
            _exercise(space)


optuna.logging.set_verbosity(optuna.logging.WARNING)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base=st.sampled_from(["bundled", "small"]),
    mutations=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=10_000),
            st.integers(min_value=0, max_value=6),
            VALUES,
            st.one_of(INTERESTING, st.text(min_size=1, max_size=6)),
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_structural_mutations(base: str, mutations: list[tuple[int, int, object, str]]) -> None:
    data = copy.deepcopy(BUNDLED_DATA if base == "bundled" else SMALL)
    for choice, op, value, key in mutations:
        if not isinstance(data, (dict, list)) or not _paths(data)[1:]:
            break
        data = _mutate(data, choice, op, value, key)
    _load(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    edits=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=len(BUNDLED_TEXT)),
            st.integers(min_value=0, max_value=12),
            st.text(alphabet=" \n:-[]{}'\"#&*!|>%@`,?0123456789abcxyz_.", max_size=6),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_text_mutations(edits: list[tuple[int, int, str]]) -> None:
    text = BUNDLED_TEXT
    for position, delete, insert in edits:
        position %= len(text) + 1
        text = text[:position] + insert + text[position + delete :]
    _load(text)
