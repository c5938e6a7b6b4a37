"""The engine upgrade of a recipe (``perturb``): effects shifted, the out-of-memory edge and
maybe a needle moved, a main-effect choice gained or lost."""

from __future__ import annotations

from typing import Any

import numpy as np

from .levers import Lever
from .recipe import Recipe


def _shift(rng: np.random.Generator, values: Any) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    return arr * (1.0 + rng.choice([-1.0, 1.0], arr.shape) * rng.uniform(0.1, 0.3, arr.shape))


def _upgrade(r: Recipe, rng: np.random.Generator) -> None:
    p = r.p
    for key in ("mA", "mB", "mC", "mT", "e2"):
        if key in p:
            p[key] = _shift(rng, p[key])
    if "I" in p:
        p["I"] = _shift(rng, p["I"])
    for name in list(p["main"]):
        p["main"][name] = _shift(rng, p["main"][name])
    for key in ("k1", "us", "mg", "q", "dstar", "ubs"):
        p[key] = float(_shift(rng, p[key]))
    p["acc"] = list(_shift(rng, p["acc"]))
    mem = r.role("mem")
    assert mem is not None
    p["t0"] += rng.choice([-1.0, 1.0]) * rng.uniform(1.0, 2.5) / (mem.n - 1)
    a, b = r.role("a"), r.role("b")
    assert a is not None
    if rng.random() < 0.5 and b is not None and ("needle2" in p or "needle3" in p):
        key = "needle3" if "needle3" in p else "needle2"
        needle = list(p[key])
        which = int(rng.integers(2))
        n = (a, b)[which].n
        moved = needle[which] + int(rng.choice([-1, 1]))
        if not 1 <= moved < n:
            moved = needle[which] - (moved - needle[which])
        pair = (moved, needle[1]) if which == 0 else (needle[0], moved)
        if 1 <= moved < n and pair not in (p.get("forbid_pair"), p.get("crash_pair")):
            old = needle[which]
            table = np.asarray(p[("mA", "mB")[which]], dtype=float)
            table[[old, moved]] = table[[moved, old]]  # the new choice inherits the purity
            p[("mA", "mB")[which]] = table
            i_old, i_new = (old, needle[1]), pair
            if which == 1:
                i_old = (needle[0], old)
            p["I"][i_old], p["I"][i_new] = p["I"][i_new], p["I"][i_old]
            needle[which] = moved
            p[key] = tuple(needle)
            if key == "needle2" and needle[0] not in p["trap_w"]:  # the trap stays off it
                p["trap_w"] = sorted([*p["trap_w"], needle[0]])
    cats = [n for n in r.main if r.lever(n).kind == "categorical"]
    if cats and rng.random() < 0.4:
        lever = r.lever(cats[int(rng.integers(len(cats)))])
        table = np.asarray(p["main"][lever.name], dtype=float)
        keep = {lever.code(r.baseline[lever.name]), int(np.argmax(table))}
        drop = [i for i in range(lever.n) if i not in keep]
        if rng.random() < 0.5 or lever.n <= 3 or not drop:
            new = _new_choice(lever)
            lever.values = (*lever.values, new)
            extra = (
                rng.uniform(0.0, table.max())
                if lever.name in r.additive
                else table.max() - abs(rng.normal(0.0, 0.1))
            )
            p["main"][lever.name] = np.append(table, extra)
        else:
            i = drop[int(rng.integers(len(drop)))]
            lever.values = tuple(v for k, v in enumerate(lever.values) if k != i)
            p["main"][lever.name] = np.delete(table, i)


def _new_choice(lever: Lever) -> Any:
    if all(isinstance(v, int) for v in lever.values):
        return max(lever.values) * 2
    return f"{lever.values[-1]}_v2"
