"""Configurations that reach every choice of a space: what the real-parser tests render.

Shared by tests/engines/test_real_parser.py (SGLang, sglang-router) and
tests/engines/test_vllm_spaces.py (vLLM): the baseline, ``samples`` seeded random launchable
configurations, then one more for every categorical/bool choice and numeric range end none of
them reached.
"""

from __future__ import annotations

import random
from typing import Any

from autotune.space import SearchSpace
from autotune.space.expr import same_value
from autotune.space.params import ParamInfo
from autotune.space.sampling import grid_values, random_value

FORCE_TRIES = 5000
"""Random fillers tried for a forced value: a range end behind a gate and a log scale
(nccl_min_nchannels=32) takes thousands of draws."""


def same(a: object, b: object) -> bool:
    """Equal and of the same type (True is not 1 here: a flag value must be what was asked)."""
    return same_value(a, b) and type(a) is type(b)


def wanted_values(param: ParamInfo) -> list[Any]:
    """Every choice of a categorical/bool parameter, or both ends of a numeric range."""
    if param.choices is not None:
        return list(param.choices)
    return [param.normalize(v) for v in grid_values(param, levels=2)]


def forced(space: SearchSpace, rng: random.Random, name: str, value: object) -> dict | None:
    """A launchable configuration (no forbidden rule) in which ``name`` is active and
    ``value``; ``None`` when random fillers for the other parameters find none."""
    for _ in range(FORCE_TRIES):
        draw = {p.name: random_value(rng, p) for p in space.sampled_params}
        draw[name] = value  # type: ignore[assignment]
        config = space.complete(draw)
        if name in config and same(config[name], value) and not space.violations(config):
            return dict(config)
    return None


def covering_configurations(
    space: SearchSpace, *, seed: int, samples: int
) -> list[tuple[str, dict[str, Any]]]:
    """(label, config) pairs; seeded by the space's name and ``seed``, so reruns render the
    same commands."""
    rng = random.Random(f"{space.name}/{seed}")
    out: list[tuple[str, dict[str, Any]]] = []
    if space.has_baseline:
        out.append(("baseline", dict(space.baseline_config())))
    for i in range(samples):
        out.append((f"sample {i}", dict(space.random_config(rng, avoid_forbidden=True))))
    for param in space.sampled_params:
        for value in wanted_values(param):
            if any(same(config.get(param.name), value) for _, config in out):
                continue
            config = forced(space, rng, param.name, value)
            if config is not None:
                out.append((f"{param.name}={value!r}", config))
    return out
