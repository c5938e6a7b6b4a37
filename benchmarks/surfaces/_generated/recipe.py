"""A surface's recipe (every number of one surface) and its three enumerated blocks."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from .constants import CRASHED, FORBIDDEN, NOISE, OK, OOM, SIGMA_RANGE, WRONG
from .levers import Lever

# ---------------------------------------------------------------------------- blocks


@dataclass
class Block:
    """One independent group of levers, enumerated: every array has one entry per point
    of the block's grid (``np.ravel_multi_index`` of the levers' codes)."""

    names: tuple[str, ...]
    shape: tuple[int, ...]
    L: np.ndarray  # smooth log effects (already shaped by the recipe's k)
    G: np.ndarray  # log gains (needles, trap)
    A: np.ndarray | None  # additive terms (main block only)
    fail: np.ndarray  # OK / WRONG / CRASHED / OOM / FORBIDDEN
    probs: np.ndarray
    sigma: np.ndarray | None = None  # numeric block: noise sigma per point
    batch: np.ndarray | None = None  # numeric block: the batch value (latency)

    @cached_property
    def lv(self) -> np.ndarray:
        """Log score of every point (before the surface's offset)."""
        if self.A is not None:
            return np.log(np.exp(self.L) + self.A) + self.G
        return self.L + self.G

    @cached_property
    def best(self) -> float:
        """The highest log score of a feasible point."""
        return float(np.max(np.where(self.fail == OK, self.lv, -np.inf)))

    def index(self, codes: Mapping[str, int]) -> int:
        if not self.shape:
            return 0
        return int(np.ravel_multi_index(tuple(codes.get(n, 0) for n in self.names), self.shape))


def _grid(levers: Sequence[Lever]) -> tuple[tuple[int, ...], dict[str, np.ndarray], np.ndarray]:
    shape = tuple(lv.n for lv in levers)
    if not shape:
        return (), {}, np.ones(1)
    idx = np.indices(shape).reshape(len(shape), -1)
    codes = {lv.name: idx[i] for i, lv in enumerate(levers)}
    probs = np.ones(idx.shape[1])
    for lv in levers:
        probs = probs * lv.probs()[codes[lv.name]]
    return shape, codes, probs


# ---------------------------------------------------------------------------- the recipe


@dataclass
class Recipe:
    """Every number of one surface. ``blocks()`` turns it into enumerated arrays."""

    level: str
    seed: int
    levers: list[Lever]  # declaration order
    roles: dict[str, str]  # role -> lever name (mem, batch, gate, child, a, b, c, trap, child2)
    main: list[str]  # main-effect levers
    additive: list[str]  # ... of which these are additive
    inert: list[str]
    p: dict[str, Any]  # effect tables and constants
    k: float = 1.0  # shape exponent of every smooth effect (set by calibration)
    v0: float = 1000.0
    offset: float = 0.0
    baseline: dict[str, Any] = field(default_factory=dict)  # lever -> value (all levers)
    upgrades: tuple[int, ...] = ()

    def lever(self, name: str) -> Lever:
        return next(lv for lv in self.levers if lv.name == name)

    def role(self, role: str) -> Lever | None:
        name = self.roles.get(role)
        return None if name is None else self.lever(name)

    @property
    def name(self) -> str:
        return f"gen-{self.level}-{self.seed}" + "".join(f"-up{u}" for u in self.upgrades)

    # ------------------------------------------------------------------ activity

    def active(self, name: str, codes: Mapping[str, int]) -> bool:
        if name == self.roles.get("child"):
            return codes[self.roles["gate"]] >= 1
        if name == self.roles.get("child2"):
            return codes[self.roles["b"]] == self.p["b2_gate"]
        return True

    def config_from_codes(self, codes: Mapping[str, int]) -> dict[str, Any]:
        return {
            lv.name: lv.values[codes[lv.name]] for lv in self.levers if self.active(lv.name, codes)
        }

    def codes_from_config(self, config: Mapping[str, Any]) -> dict[str, int]:
        return {lv.name: lv.code(config[lv.name]) for lv in self.levers if lv.name in config}

    # ------------------------------------------------------------------ blocks

    def blocks(self) -> tuple[Block, Block, Block]:
        return (self._num_block(), self._cat_block(), self._main_block())

    def _num_block(self) -> Block:
        p = self.p
        mem, batch = self.role("mem"), self.role("batch")
        gate, child = self.role("gate"), self.role("child")
        assert mem is not None and batch is not None
        levers = [mem, batch] + ([gate, child] if gate is not None and child is not None else [])
        shape, g, probs = _grid(levers)
        um = mem.unit()[g[mem.name]]
        ub = batch.unit()[g[batch.name]]
        bval = np.asarray(batch.values, dtype=float)[g[batch.name]]
        if gate is not None and child is not None:
            on = (g[gate.name] >= 1).astype(float)
            acc = np.asarray(p["acc"])[g[gate.name]]
            depth = np.asarray(child.values, dtype=float)[g[child.name]]
            dn = child.unit()[g[child.name]]
        else:
            on = acc = depth = dn = np.zeros_like(um)
        ovh = on * (p["o1"] + p["o2"] * dn)
        thr = p["t0"] - p["tb"] * ub - ovh
        oom = um > thr + 1e-9
        cap = np.maximum(p["k0"] + p["k1"] * um - p["kc"] * ovh, 0.05)
        ue = np.minimum(ub, cap) + 0.02
        tput = ue / (1.0 + (ue / p["us"]) ** 4) ** 0.25  # linear, then compute-bound
        tput = tput * (1.0 + p["mg"] * um)  # more KV cache: more prefix hits
        pen = 1.0 / (1.0 + p["q"] * np.maximum(ub - cap, 0.0) / cap)
        shape_d = np.maximum(0.0, 1.0 - ((depth - p["dstar"]) / p["dw"]) ** 2) - p["dcost"] * dn
        gs = np.maximum(1.0 + on * acc * shape_d * (1.0 - ub / p["ubs"]), 0.5)
        L = np.log(tput * pen * gs)  # its own shape: the range the baseline lives in
        crashed = (on > 0) & (depth >= p.get("dcrash", 1e9)) & (ub >= p.get("ucrash", 2.0) - 1e-9)
        forbidden = (on > 0) & (depth >= p.get("dforb", 1e9)) & (bval >= p.get("bforb", 1e18))
        fail = np.where(forbidden, FORBIDDEN, np.where(oom, OOM, np.where(crashed, CRASHED, OK)))
        base, grow, edge = NOISE[self.level]
        near = (~oom) & (thr - um < 1.5 / (mem.n - 1))
        sigma = np.clip(base * (1.0 + grow * ub) + edge * near, *SIGMA_RANGE)
        if self.level == "heldout":
            sigma = np.full_like(um, base)
        return Block(
            tuple(lv.name for lv in levers),
            shape,
            L,
            np.zeros_like(L),
            None,
            fail.astype(np.int8),
            probs,
            sigma=sigma,
            batch=bval,
        )

    def _cat_block(self) -> Block:
        p = self.p
        a, b, c = self.role("a"), self.role("b"), self.role("c")
        trap, child2 = self.role("trap"), self.role("child2")
        assert a is not None and trap is not None
        levers = [lv for lv in (a, b, c, trap, child2) if lv is not None]
        shape, g, probs = _grid(levers)
        ca = g[a.name]
        cb = g[b.name] if b is not None else np.zeros_like(ca)
        cc = g[c.name] if c is not None else np.zeros_like(ca)
        ct = g[trap.name]
        aggressive = ct == trap.n - 1
        k = self.k
        L = _shape(p["mA"], k)[ca] + _shape(p["mT"], k)[ct]
        G = np.zeros(ca.shape)
        if b is not None:
            L = L + _shape(p["mB"], k)[cb] + _shape(p["I"], k)[ca, cb]
        if c is not None:
            L = L + _shape(p["mC"], k)[cc]
        if child2 is not None:
            act = cb == p["b2_gate"]
            L = L + act * (p["off2"] + _shape(p["e2"], k)[g[child2.name]])
        if "needle2" in p:
            na, nb, gain = p["needle2"]
            G = G + math.log(gain) * ((ca == na) & (cb == nb))
        if "needle3" in p:
            na, nb, nc, gain = p["needle3"]
            G = G + math.log(gain) * ((ca == na) & (cb == nb) & (cc == nc))
        G = G + math.log(p["trap_gain"]) * aggressive
        mode = p["trap_mode"]
        if mode == "always":
            cond = np.ones(ca.shape, dtype=bool)
        else:
            cond = np.isin(ca, p["trap_w"])
            if mode == "needle_c":
                cond = cond | (cc == p["needle3"][2])
        wrong = aggressive & cond
        crashed = np.zeros(ca.shape, dtype=bool)
        if "crash_pair" in p:
            crashed = (ca == p["crash_pair"][0]) & (cb == p["crash_pair"][1])
        forbidden = np.zeros(ca.shape, dtype=bool)
        if "forbid_pair" in p:
            forbidden = (ca == p["forbid_pair"][0]) & (cb == p["forbid_pair"][1])
        fail = np.where(
            forbidden, FORBIDDEN, np.where(crashed, CRASHED, np.where(wrong, WRONG, OK))
        )
        return Block(
            tuple(lv.name for lv in levers), shape, L, G, None, fail.astype(np.int8), probs
        )

    def _main_block(self) -> Block:
        levers = [self.lever(n) for n in self.main]
        shape, g, probs = _grid(levers)
        L = np.zeros(probs.shape)
        A = np.zeros(probs.shape)
        for lv in levers:
            table = np.asarray(self.p["main"][lv.name], dtype=float)
            if lv.name in self.additive:
                A = A + (table.max() + _shape(table, self.k))[g[lv.name]]
            else:
                L = L + _shape(table, self.k)[g[lv.name]]
        fail = np.zeros(probs.shape, dtype=np.int8)
        return Block(tuple(lv.name for lv in levers), shape, L, np.zeros_like(L), A, fail, probs)

    # ------------------------------------------------------------------ the space file

    def space_data(self) -> dict[str, Any]:
        rules = []
        if "forbid_pair" in self.p:
            a, b = self.role("a"), self.role("b")
            assert a is not None and b is not None
            va, vb = a.values[self.p["forbid_pair"][0]], b.values[self.p["forbid_pair"][1]]
            rules.append(
                {
                    "name": f"no_{va}_with_{vb}",
                    "when": f"{a.name} == {_lit(va)} and {b.name} == {_lit(vb)}",
                    "reason": f"the {va} kernels have no {vb} variant (refused at parsing)",
                }
            )
        if "dforb" in self.p:
            child, batch = self.role("child"), self.role("batch")
            assert child is not None and batch is not None
            rules.append(
                {
                    "name": "deep_speculation_large_batch",
                    "when": f"{child.name} >= {int(self.p['dforb'])} and "
                    f"{batch.name} >= {int(self.p['bforb'])}",
                    "reason": "draft trees this deep cannot be captured at this batch "
                    "(refused at start-up)",
                }
            )
        codes = {lv.name: lv.code(self.baseline[lv.name]) for lv in self.levers}
        data: dict[str, Any] = {
            "name": self.name,
            "description": f"Generated {self.level} surface, seed {self.seed}.",
            "services": ["server"],
            "engine": {"name": "generic"},
            "parameters": {lv.name: lv.spec() for lv in self.levers},
        }
        if rules:
            data["forbidden"] = rules
        data["baseline"] = self.config_from_codes(codes)
        return data


def _shape(table: Any, k: float) -> np.ndarray:
    """An effect table reshaped by exponent ``k``, its best entry 0 and its range kept:
    each entry's deficit from the best, as a share d of the range, becomes d ** k (k > 1:
    broad near-optimal plateaus; k < 1: sharp peaks). Monotone in k: a larger k never
    lowers an entry, so the needle fraction grows with k."""
    t = np.asarray(table, dtype=float)
    top, span = float(t.max()), float(t.max() - t.min())
    if span <= 0.0:
        return np.zeros_like(t)
    return -span * ((top - t) / span) ** k


def _lit(value: Any) -> str:
    return f"'{value}'" if isinstance(value, str) else repr(value)
