"""Drawing a recipe from a seed: its levers, effect tables, needles, trap and baseline."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .constants import LEVELS, LEVER_COUNTS, NUM_SHAPE, PRESETS
from .levers import (
    BATCH_POOL,
    CAT_POOL,
    CHILD2_POOL,
    GATE_POOL,
    INERT_POOL,
    MAIN_POOL,
    MEM_POOL,
    TRAP_POOL,
    Lever,
    _bool,
    _cat,
    _int,
)
from .recipe import Recipe, _lit

# ---------------------------------------------------------------------------- drawing


def _table(rng: np.random.Generator, lever: Lever, size: float) -> np.ndarray:
    """A main effect (log, max 0) of ``size`` for one lever: random for categorical and
    bool levers, peaked or monotone over the (log) range for numeric ones."""
    if lever.kind in ("categorical", "bool"):
        e = rng.normal(0.0, 1.0, lever.n) * size
        return e - e.max()
    u = lever.unit()
    if rng.random() < 0.6:
        peak, width = rng.random(), rng.uniform(0.25, 0.6)
        e = -size * ((u - peak) / width) ** 2
    else:
        e = -size * (u if rng.random() < 0.5 else 1.0 - u) ** rng.uniform(0.7, 2.0)
    e = np.maximum(e, -4.0 * size)
    return e - e.max()


def _additive(rng: np.random.Generator, lever: Lever, size: float) -> np.ndarray:
    """An additive term in [0, size], its best value at ``size``."""
    if lever.kind in ("categorical", "bool"):
        shape = rng.random(lever.n)
    else:
        shape = np.exp(-(((lever.unit() - rng.random()) / rng.uniform(0.2, 0.5)) ** 2))
    return size * shape / shape.max()


def _size(rng: np.random.Generator, scale: float) -> float:
    return float(scale * math.exp(rng.normal(0.0, 0.6)))


def _pick(rng: np.random.Generator, pool: Sequence[Any]) -> Any:
    return pool[int(rng.integers(len(pool)))]


def _draw(seed: int, level: str, attempt: int) -> Recipe:
    salt = (LEVELS + PRESETS).index(level)
    rng = np.random.default_rng([16, salt, seed, attempt])
    lo, hi = LEVER_COUNTS[level]
    total = int(rng.integers(lo, hi + 1))
    p: dict[str, Any] = {}
    roles: dict[str, str] = {}
    levers: list[Lever] = []

    def add(role: str, lever: Lever) -> Lever:
        roles[role] = lever.name
        levers.append(lever)
        return lever

    # numeric block
    add("mem", _pick(rng, MEM_POOL)())
    batch = add("batch", _pick(rng, BATCH_POOL)())
    sharp = NUM_SHAPE[level]
    p.update(
        t0=rng.uniform(*sharp["t0"]),
        tb=rng.uniform(*sharp["tb"]),
        k0=rng.uniform(*sharp["k0"]),
        k1=rng.uniform(*sharp["k1"]),
        kc=rng.uniform(0.5, 1.5),
        us=rng.uniform(*sharp["us"]),
        mg=rng.uniform(*sharp["mg"]),
        q=rng.uniform(*sharp["q"]),
        o1=0.0,
        o2=0.0,
        acc=[0.0],
        dstar=1.0,
        dw=1.0,
        dcost=0.0,
        ubs=1.0,
    )
    want_gate = level in ("medium", "hard") or (level == "easy" and rng.random() < 0.3)
    if want_gate:
        gname, gchoices = _pick(rng, GATE_POOL)
        gate = add("gate", _bool(gname) if gchoices is None else _cat(gname, gchoices))
        depth_max = int(rng.integers(4, 8))
        child = add("child", _int("speculative_num_steps", 1, depth_max))
        child.when = gate.name if gate.kind == "bool" else f"{gate.name} != 'off'"
        p.update(
            o1=rng.uniform(0.03, 0.08),
            o2=rng.uniform(0.03, 0.1),
            acc=[0.0, *sorted(rng.uniform(*sharp["acc"], gate.n - 1))],
            dstar=rng.uniform(1.5, depth_max - 0.5),
            dw=rng.uniform(1.5, 3.5),
            dcost=rng.uniform(0.05, 0.25),
            ubs=rng.uniform(0.35, 0.8),
        )
        if level != "easy":
            p["dcrash"] = float(depth_max - int(rng.integers(0, 2)))
            p["ucrash"] = rng.uniform(0.5, 0.8)
            p["dforb"] = float(depth_max)
            p["bforb"] = float(batch.values[int(round(0.75 * (batch.n - 1)))])

    # categorical block
    cats = [CAT_POOL[i] for i in rng.permutation(len(CAT_POOL))]
    n_range = {"easy": (3, 5), "medium": (3, 6), "hard": (3, 6), "heldout": (3, 5)}[level]

    def cat_lever(role: str) -> Lever:
        name, choices = cats.pop()
        k = int(rng.integers(n_range[0], min(n_range[1], len(choices)) + 1))
        return add(role, _cat(name, choices[:k]))

    a = cat_lever("a")
    p["mA"] = _table(rng, a, _size(rng, 0.25))
    want_b = level != "easy" or rng.random() < 0.6
    b = cat_lever("b") if want_b else None
    c = cat_lever("c") if level == "hard" else None
    if b is not None:
        p["mB"] = _table(rng, b, _size(rng, 0.2))
        sigma_i = 0.03 if level == "easy" else 0.08
        p["I"] = rng.normal(0.0, sigma_i, (a.n, b.n))
    if c is not None:
        p["mC"] = _table(rng, c, _size(rng, 0.15))
    tname, tchoices = _pick(rng, TRAP_POOL)
    trap = add("trap", _bool(tname, switch=False) if tchoices is None else _cat(tname, tchoices))
    mt = np.zeros(trap.n)
    if trap.n > 2:  # the middle choice is a genuine, correct option
        mt[1:-1] = rng.normal(0.0, 0.05, trap.n - 2)
        mt -= mt[:-1].max()
        mt[-1] = mt[0]
    p["mT"] = mt

    def pure(table_key: str, choice: int) -> None:
        """No partial credit: the needle's choice is a little worse than the best other
        choice on its own."""
        table = np.asarray(p[table_key], dtype=float)
        others = np.delete(table, choice)
        table[choice] = others.max() - rng.uniform(0.01, 0.05)
        p[table_key] = table - table.max()

    def plain_pair(i: int, j: int) -> None:
        """The needle's pair has an ordinary interaction (its 75th percentile)."""
        p["I"][i, j] = float(np.percentile(p["I"], 75))

    if level == "easy":
        p.update(trap_gain=rng.uniform(1.15, 1.5), trap_mode="always")
    elif level in ("medium", "heldout"):
        assert b is not None
        na, nb = int(rng.integers(1, a.n)), int(rng.integers(1, b.n))
        gain = rng.uniform(1.18, 1.35)
        p["needle2"] = (na, nb, gain)
        pure("mA", na)
        pure("mB", nb)
        plain_pair(na, nb)
        w = [na, *[i for i in rng.permutation(a.n) if i != na][: max(0, (a.n - 1) // 2)]]
        trap_gain = rng.uniform(1.05, min(1.15, gain / 1.12))
        p.update(trap_gain=trap_gain, trap_mode="in_a", trap_w=sorted(w))
    else:
        assert b is not None and c is not None
        na, nb, nc = int(rng.integers(1, a.n)), int(rng.integers(1, b.n)), int(rng.integers(1, c.n))
        pure("mA", na)
        pure("mB", nb)
        pure("mC", nc)
        plain_pair(na, nb)
        decoy = (int(rng.integers(1, a.n)), int(rng.integers(1, b.n)))
        decoy_gain = rng.uniform(1.05, 1.1) if decoy != (na, nb) else 1.0
        if decoy_gain > 1.0:
            p["needle2"] = (*decoy, decoy_gain)
        trap_gain = rng.uniform(1.08, 1.18)
        gain = max(rng.uniform(1.25, 1.45), 1.12 * trap_gain * decoy_gain)
        p["needle3"] = (na, nb, nc, gain)
        wa = [i for i in range(a.n) if i != na]
        p.update(trap_gain=trap_gain, trap_mode="needle_c", trap_w=[wa[int(rng.integers(len(wa)))]])
        if rng.random() < 0.6 and len(levers) < total - 1:
            child2 = add("child2", _pick(rng, CHILD2_POOL)())
            b2 = int(rng.integers(1, b.n))
            child2.when = f"{b.name} == {_lit(b.values[b2])}"
            p["b2_gate"] = b2
            p["e2"] = _table(rng, child2, _size(rng, 0.25))
            p["off2"] = rng.uniform(-0.05, 0.08)
    if b is not None and level in ("medium", "hard"):
        taken = {(0, 0)}
        for key in ("needle2", "needle3"):
            if key in p:
                taken.add((p[key][0], p[key][1]))
        pairs = [(i, j) for i in range(a.n) for j in range(b.n) if (i, j) not in taken]
        if level == "hard" and "needle3" in p:  # keep the needle's plane reachable
            pairs = [(i, j) for i, j in pairs if (i, j) != p["needle3"][:2]]
        picks = rng.permutation(len(pairs))[:2]
        p["forbid_pair"] = pairs[int(picks[0])]
        p["crash_pair"] = pairs[int(picks[1])]

    # main-effect block and inert levers
    rest = max(0, total - len(levers))
    n_inert = min(rest, int(rng.integers(0, 2)) if level != "heldout" else 0)
    n_main = rest - n_inert
    used = {lv.name for lv in levers}
    main: list[str] = []
    additive: list[str] = []
    p["main"] = {}
    for make in (MAIN_POOL[int(i)] for i in rng.permutation(len(MAIN_POOL))):
        if len(main) == n_main:
            break
        lever = make()
        if lever.name in used:
            continue
        used.add(lever.name)
        levers.append(lever)
        main.append(lever.name)
        if rng.random() < 0.3 and level != "heldout":
            additive.append(lever.name)
            p["main"][lever.name] = _additive(rng, lever, rng.uniform(0.02, 0.08))
        else:
            p["main"][lever.name] = _table(rng, lever, _size(rng, 0.15))
    inert: list[str] = []
    for i in rng.permutation(len(INERT_POOL))[:n_inert]:
        lever = INERT_POOL[int(i)]()
        levers.append(lever)
        inert.append(lever.name)

    # declaration order: shuffled, children right after their parents
    order = [levers[int(i)] for i in rng.permutation(len(levers))]
    for child_role, parent_role in (("child", "gate"), ("child2", "b")):
        if child_role in roles:
            kid = next(lv for lv in order if lv.name == roles[child_role])
            order.remove(kid)
            at = next(i for i, lv in enumerate(order) if lv.name == roles[parent_role])
            order.insert(at + 1, kid)

    baseline: dict[str, Any] = {}
    for lever in order:
        if lever.name == roles["mem"]:
            code = int(round(0.3 * (lever.n - 1)))
        elif lever.name == roles["batch"]:
            code = int(rng.integers(1, 3))
        elif lever.name in main:
            table = np.asarray(p["main"][lever.name])
            worse = [i for i in range(lever.n) if table[i] < table.max()]
            code = int(_pick(rng, worse)) if worse else 0
        elif lever.name in inert:
            code = int(rng.integers(lever.n))
        elif lever.name == roles.get("child"):
            code = 1
        elif lever.name == roles.get("child2"):
            code = lever.n // 2
        else:  # categoricals, trap, gate: the first choice
            code = 0
        baseline[lever.name] = lever.values[code]

    return Recipe(
        level=level,
        seed=seed,
        levers=order,
        roles=roles,
        main=main,
        additive=additive,
        inert=inert,
        p=p,
        v0=float(round(rng.uniform(300.0, 3000.0), 1)),
        baseline=baseline,
    )
