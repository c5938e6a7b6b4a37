"""Generated surfaces with as many forbidden rules as a real engine's space has.

Why: the spaces written from vLLM 0.26.0's own refusals forbid about half of what a random
draw proposes (the H200 dense random arm: 63 of 135 trials; the H100 MoE study: 5 of its
first 10, vLLM refuses Marlin for bf16 experts), while the generated family forbids 0-4% and
the bundled surfaces up to 15%. A sampler rule about forbidden proposals (what the start-up
counts, ``autotune.study.hints.in_startup``) is judged on the family only once the family
has rules of that weight too.

``gen-<level>-<seed>-rules<P>`` is ``gen-<level>-<seed>`` plus seeded rules of the shape real
refusals take, one lever's choice requiring another lever's value ("``moe_backend ==
'marlin'`` needs fp8 experts"): ``X == c and Y != y`` for a categorical or two-way ``X``
(``c`` not the optimum's choice), and ``Y`` another always-active lever (``!=`` its optimum
value, or for a number ``>``/``<`` it), added until a Monte Carlo estimate of the forbidden
share of random draws reaches P%. The optimum and the baseline are never forbidden, so the
optimum, the evaluator and the noise model are the surface's own; the needle fraction is
not exact any more and is left out.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from autotune.errors import ConfigError
from autotune.space import SearchSpace, parse_space

RULES_RE = re.compile(r"(.+)-rules(\d+)")
DRAWS = 2000
"""Random draws behind the forbidden share's estimate (+-1.1 points at 50%)."""
MAX_RULES = 40


def split_rules(name: str) -> tuple[str, int | None]:
    """``gen-medium-3-rules50`` -> (``gen-medium-3``, 50); a name without rules -> (name,
    None)."""
    match = RULES_RE.fullmatch(name)
    if match is None:
        return name, None
    share = int(match.group(2))
    if not 0 < share < 100:
        raise SystemExit(f"bad surface {name!r}: -rules<P> takes a share P in 1-99 (percent)")
    return match.group(1), share


def forbidden_share(space: SearchSpace, *, draws: int = DRAWS, seed: int = 0) -> float:
    """Share of ``SearchSpace.random_config`` draws that break a rule."""
    rng = random.Random(seed)
    return sum(bool(space.violations(space.random_config(rng))) for _ in range(draws)) / draws


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, str):
        return repr(value)
    return str(value)


def _rule(
    rng: np.random.Generator,
    params: Mapping[str, Mapping[str, Any]],
    optimum: Mapping[str, Any],
) -> tuple[str, str] | None:
    """One candidate ``(name, when)``, or None when the draw gives nothing usable."""
    free = [n for n, p in params.items() if "when" not in p and n in optimum]
    switches = [n for n in free if params[n]["type"] in ("categorical", "bool")]
    if not switches or len(free) < 2:
        return None
    x = switches[int(rng.integers(len(switches)))]
    choices = [True, False] if params[x]["type"] == "bool" else list(params[x]["choices"])
    others = [c for c in choices if c != optimum[x]]
    if not others:
        return None
    c = others[int(rng.integers(len(others)))]
    y = [n for n in free if n != x][int(rng.integers(len(free) - 1))]
    if params[y]["type"] in ("categorical", "bool"):
        need = f"{y} != {_literal(optimum[y])}"
    else:
        op = ">" if rng.random() < 0.5 else "<"
        need = f"{y} {op} {_literal(optimum[y])}"
    return f"{x}_{len(choices)}_needs_{y}", f"{x} == {_literal(c)} and {need}"


def with_rules(
    space_data: Mapping[str, Any],
    *,
    optimum: Mapping[str, Any],
    share: float,
    seed: int,
    file: str,
) -> tuple[SearchSpace, float]:
    """``space_data``'s space with rules added until random draws are ``share`` forbidden,
    and the estimated share."""
    first = list(space_data.get("forbidden", []))
    rules = first
    rng = np.random.default_rng([97, seed, round(1000 * share)])
    space = parse_space({**space_data, "forbidden": rules}, file=file)
    current = forbidden_share(space, seed=seed)
    for i in range(4 * MAX_RULES):
        if current >= share or len(rules) >= len(first) + MAX_RULES:
            break
        candidate = _rule(rng, space_data["parameters"], optimum)
        if candidate is None:
            continue
        name, when = candidate
        trial = [*rules, {"name": f"{name}_{i}", "when": when, "reason": "generated rule"}]
        try:  # the loader refuses a rule the baseline breaks
            parsed = parse_space({**space_data, "forbidden": trial}, file=file)
        except ConfigError:
            continue
        if parsed.violations(dict(optimum)):
            continue
        rules, space = trial, parsed
        current = forbidden_share(space, seed=seed)
    return space, current
