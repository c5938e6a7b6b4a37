"""Seeded synthetic tuning surfaces (issue 16): a family of pure functions, no servers.

``generate(seed, level=...)`` draws one surface: a search space (``space_data``, parsed by
the real ``autotune.space.loader.parse_space``: conditional ``when:`` levers, ``forbidden:``
rules and a baseline included), an evaluator (``evaluate(config) -> Result``), a
heteroscedastic noise model (``noise_sigma(config)``), the exact optimum and the exact
share of the space (under ``SearchSpace.random_config``'s distribution) within 5% of it.
Same ``(seed, level)``, same surface. ``family(30)`` is ten of each level;
``perturb(surface, seed)`` is a seeded "engine upgrade" of a surface.

How a surface is built. The levers fall into three independent blocks, and the score is
``V0 * exp(lv_num + lv_cat + lv_main - offset)``:

* the *numeric* block: a memory-like lever (float or int with a step), a batch-like int,
  and (medium, hard, some easy) a speculative gate with a conditional depth. The KV
  capacity grows with memory, throughput grows with the batch (linear, then
  compute-bound) up to that capacity and falls past it (preemption), a little with the
  memory (prefix hits), speculation pays at small batch and costs at large batch. This
  block keeps its own shape: it is where the baseline's distance from the optimum lives.
  ``cuda_oom`` above a memory threshold that drops with the batch and with the draft's
  memory; ``crashed`` for deep speculation at large batch; a forbidden corner of it.
* the *categorical* block: two or three categoricals with main effects, a smooth pairwise
  interaction, and pure needles (a gain only for one exact combination of two (medium)
  or three (hard) choices, with no partial credit: the needle's choices are not the best
  on their own); a wrong-output trap (an aggressive approximation, faster by its gain,
  wrong everywhere (easy), for half the first categorical's choices (medium), or at the
  3-way needle's third choice (hard: the trap sits one lever away from the optimum); a
  conditional lever active under one choice of the second categorical (some hard); a
  crashing pair and a forbidden pair.
* the *main-effect* block: separable levers of every kind (categorical, int with a step,
  log int, float with a step, bool), multiplicative main effects of varied size (random
  for choices; peaked or monotone over the range for numbers) and additive ones
  (``log(exp(sum effects) + sum additive)``).
* inert levers do nothing at all.

A failure in any block fails the launch (forbidden > cuda_oom > crashed > wrong_output).
The blocks are independent, so the optimum is the product of the blocks' feasible maxima
(each block enumerated exactly: a few thousand points) and the needle fraction is exact:
every lever's probability under ``random_config`` (uniform on a grid; log ints by the
interval that rounds to each integer) multiplies across its block, and the blocks combine
by one outer sum and a sorted search. One shape exponent ``k`` reshapes every effect
table of the categorical and main-effect blocks, keeping its range (a deficit that is a
share d of the range becomes d ** k: broad plateaus for k > 1, sharp peaks for k < 1); it
is set by bisection so that the needle fraction lands in the level's band (easy 1-5%,
medium 0.1-1%, hard < 0.1%), and a draw that cannot get there, or whose optimum is not on
its needle, or whose crash and trap regions are too small to meet at random, is drawn
again (seeded: still the same surface for the same seed). The baseline (defaults: low
batch, conservative memory, first choices, no speculation, no approximation) is then
nudged, batch, memory and main-effect levers only, until it sits at 2-20% of the optimum.

Generating one surface (calibration included) takes 5-100 ms; ``python
benchmarks/surfaces/generated.py [N]`` prints the family's figures.

Presets: ``level="heldout"`` is shaped like the held-out surface a user reported: six
levers (two categoricals with an interaction and a gain for exactly one combination, a
memory/batch crash region, a wrong-output trap, one main-effect lever), 3% noise.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

LEVELS = ("easy", "medium", "hard")
PRESETS = ("heldout",)
WITHIN = 0.95
"""A configuration within 5% of the optimum counts toward the needle fraction."""
BANDS: dict[str, tuple[float, float]] = {
    "easy": (0.01, 0.05),
    "medium": (0.001, 0.01),
    "hard": (0.00001, 0.001),
    "heldout": (0.001, 0.01),
}
"""Needle fraction each level is calibrated into (the test checks it)."""
TARGETS = {"easy": 0.022, "medium": 0.0025, "hard": 0.00008, "heldout": 0.0025}
ACCEPT: dict[str, tuple[float, float]] = {
    "easy": (0.013, 0.04),
    "medium": (0.0012, 0.008),
    "hard": (0.000025, 0.0005),
    "heldout": (0.0012, 0.008),
}
"""What a draw must reach to be kept (inside BANDS, so an upgrade stays near its band)."""
BASELINE_BAND = (0.02, 0.20)
"""The baseline's value as a share of the optimum."""
LEVER_COUNTS = {"easy": (5, 7), "medium": (7, 10), "hard": (9, 12), "heldout": (6, 6)}
NOISE = {  # base sigma, growth with batch, extra within 1.5 memory steps of the OOM edge
    "easy": (0.012, 0.5, 0.010),
    "medium": (0.020, 0.6, 0.015),
    "hard": (0.030, 0.6, 0.025),
    "heldout": (0.030, 0.0, 0.0),
}
SIGMA_RANGE = (0.01, 0.06)
K_RANGE = (0.2, 4.0)
"""Shape exponents calibration may pick (past 4, most of a lever's range is a plateau)."""
_EASY_NUM = {
    "t0": (0.75, 0.92),
    "tb": (0.1, 0.25),
    "k0": (0.35, 0.55),
    "k1": (1.0, 1.6),
    "us": (0.18, 0.3),
    "mg": (0.02, 0.06),
    "q": (0.5, 1.5),
    "acc": (0.05, 0.2),
}
NUM_SHAPE: dict[str, dict[str, tuple[float, float]]] = {  # ranges of the numeric block's shape
    "easy": _EASY_NUM,
    "medium": {
        "t0": (0.75, 0.92),
        "tb": (0.1, 0.25),
        "k0": (0.35, 0.55),
        "k1": (1.0, 1.6),
        "us": (0.18, 0.3),
        "mg": (0.03, 0.08),
        "q": (0.6, 1.6),
        "acc": (0.05, 0.25),
    },
    "hard": {
        "t0": (0.7, 0.9),
        "tb": (0.15, 0.3),
        "k0": (0.2, 0.4),
        "k1": (0.9, 1.4),
        "us": (0.25, 0.4),
        "mg": (0.08, 0.2),
        "q": (1.0, 2.5),
        "acc": (0.15, 0.5),
    },
    "heldout": _EASY_NUM,
}
NAME_RE = re.compile(r"^gen-(easy|medium|hard|heldout)-(\d+)((?:-up\d+)*)$")

OK, WRONG, CRASHED, OOM, FORBIDDEN = 0, 1, 2, 3, 4
FAILURES = {WRONG: "wrong_output", CRASHED: "crashed", OOM: "cuda_oom", FORBIDDEN: "forbidden"}


@dataclass(frozen=True)
class Result:
    """One launch: the score (tok/s), its per-token latency, or why it failed."""

    value: float = 0.0
    latency_ms: float | None = None
    failure: str | None = None
    reason: str = ""


# ---------------------------------------------------------------------------- levers


def _places(number: float) -> int:
    text = repr(float(number))
    return len(text.split(".")[1].rstrip("0")) if "." in text and "e" not in text else 0


@dataclass
class Lever:
    """One parameter: its domain (``values``, indexed by code) and where it goes."""

    name: str
    kind: str  # categorical | int | float | bool
    values: tuple[Any, ...]
    low: float = 0.0
    high: float = 0.0
    step: float | None = None
    log: bool = False
    when: str | None = None
    target: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.values)

    def spec(self) -> dict[str, Any]:
        """The parameter as a space file writes it."""
        out: dict[str, Any] = {"type": self.kind}
        if self.kind == "categorical":
            out["choices"] = list(self.values)
        elif self.kind in ("int", "float"):
            cast = int if self.kind == "int" else float
            out["low"], out["high"] = cast(self.low), cast(self.high)
            if self.step is not None:
                out["step"] = cast(self.step)
            if self.log:
                out["log"] = True
        if self.when is not None:
            out["when"] = self.when
        out["target"] = dict(self.target)
        return out

    def probs(self) -> np.ndarray:
        """P(each value) under ``random_config`` (Optuna's RandomSampler)."""
        if self.kind == "int" and self.log:
            v = np.asarray(self.values, dtype=float)
            lo = np.log(np.maximum(v - 0.5, self.low))
            hi = np.log(np.minimum(v + 0.5, self.high))
            return (hi - lo) / (math.log(self.high) - math.log(self.low))
        return np.full(self.n, 1.0 / self.n)

    def unit(self) -> np.ndarray:
        """Each value's position in its range, 0..1 (by log for log levers, by index for
        categorical and bool)."""
        if self.kind in ("int", "float"):
            v = np.asarray(self.values, dtype=float)
            if self.log:
                return (np.log(v) - math.log(self.low)) / (math.log(self.high) - math.log(self.low))
            return (v - self.low) / (self.high - self.low)
        return np.arange(self.n) / max(1, self.n - 1)

    def code(self, value: Any) -> int:
        """The index of a (normalised) value."""
        if self.kind == "float":
            assert self.step is not None
            return int(round((float(value) - self.low) / self.step))
        if self.kind == "int":
            return (
                int(value) - int(self.low)
                if self.log
                else (int(value) - int(self.low)) // int(self.step or 1)
            )
        for i, choice in enumerate(self.values):
            if choice == value and type(choice) is type(value):
                return i
        raise KeyError(f"{value!r} is not a value of {self.name}")


def _flag(name: str) -> dict[str, Any]:
    return {"flag": "--" + name.replace("_", "-")}


def _cat(name: str, choices: Sequence[Any]) -> Lever:
    return Lever(name, "categorical", tuple(choices), target=_flag(name))


def _bool(name: str, *, switch: bool = True) -> Lever:
    target = {"switch": "--" + name.replace("_", "-")} if switch else _flag(name)
    return Lever(name, "bool", (False, True), target=target)


def _int(name: str, low: int, high: int, step: int = 1) -> Lever:
    values = tuple(range(low, high + 1, step))
    return Lever(name, "int", values, low, high, step, target=_flag(name))


def _logint(name: str, low: int, high: int) -> Lever:
    return Lever(
        name, "int", tuple(range(low, high + 1)), low, high, None, True, target=_flag(name)
    )


def _float(name: str, low: float, high: float, step: float) -> Lever:
    places = max(_places(low), _places(step))
    count = int(round((high - low) / step)) + 1
    values = tuple(round(low + k * step, places) for k in range(count))
    return Lever(name, "float", values, low, high, step, target=_flag(name))


# Pools the generator draws levers from (names only set the scene; roles set the effects).
MEM_POOL: tuple[Callable[[], Lever], ...] = (
    lambda: _float("mem_fraction_static", 0.70, 0.96, 0.02),
    lambda: _float("gpu_memory_utilization", 0.60, 0.95, 0.05),
    lambda: _int("kv_cache_gb", 8, 96, 8),
    lambda: _int("kv_cache_blocks", 1024, 16384, 1024),
)
BATCH_POOL: tuple[Callable[[], Lever], ...] = (
    lambda: _int("max_running_requests", 16, 256, 16),
    lambda: _int("max_num_seqs", 32, 384, 32),
    lambda: _int("max_batch_size", 8, 128, 8),
    lambda: _int("decode_batch", 4, 64, 4),
)
CAT_POOL: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention_backend", ("flashinfer", "triton", "fa3", "cutlass_mla", "trtllm_mha", "torch")),
    ("moe_runner_backend", ("auto", "triton", "deep_gemm", "cutlass", "trtllm", "marlin")),
    ("all_reduce_impl", ("nccl", "custom", "one_shot", "two_shot", "symm_mem", "mscclpp")),
    ("nccl_proto", ("Simple", "LL", "LL128", "auto")),
    ("cuda_graph_mode", ("none", "piecewise", "full", "full_decode_only", "mixed")),
    ("kv_layout", ("NHD", "HND", "paged_nhd", "paged_hnd", "ragged")),
    ("schedule_policy", ("fcfs", "lpm", "dfs_weight", "lof", "random", "priority")),
    ("sampling_backend", ("pytorch", "flashinfer", "triton", "fused")),
)
TRAP_POOL: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    ("fast_math_approx", None),
    ("approximate_softmax", None),
    ("kv_cache_dtype", ("auto", "fp8_e4m3", "fp4_e2m1")),
    ("weight_format", ("bf16", "fp8", "nvfp4")),
    ("logits_precision", ("fp32", "bf16", "fp8_lossy")),
)
GATE_POOL: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    ("speculative_decoding", None),
    ("speculative_algorithm", ("off", "ngram", "eagle")),
    ("speculative_algorithm", ("off", "ngram", "eagle", "mtp")),
)
MAIN_POOL: tuple[Callable[[], Lever], ...] = (
    lambda: _cat("chunked_prefill_size", (1024, 2048, 4096, 8192, 16384)),
    lambda: _cat("tokenizer_pool", ("none", "thread", "process")),
    lambda: _logint("stream_interval", 1, 32),
    lambda: _logint("omp_num_threads", 1, 64),
    lambda: _logint("num_continuous_decode_steps", 1, 16),
    lambda: _int("nccl_nchannels", 4, 32, 4),
    lambda: _int("max_prefill_tokens", 4096, 32768, 4096),
    lambda: _float("schedule_conservativeness", 0.3, 1.5, 0.1),
    lambda: _float("prefill_priority", 0.0, 1.0, 0.05),
    lambda: _bool("enable_prefix_caching"),
    lambda: _bool("overlap_schedule"),
    lambda: _bool("enable_mixed_chunk"),
)
INERT_POOL: tuple[Callable[[], Lever], ...] = (
    lambda: _cat("log_level", ("debug", "info", "warning", "error")),
    lambda: _bool("enable_metrics"),
    lambda: _int("watchdog_timeout", 60, 600, 60),
    lambda: _float("api_timeout_s", 10.0, 60.0, 5.0),
    lambda: _logint("decode_log_interval", 1, 1000),
)
CHILD2_POOL: tuple[Callable[[], Lever], ...] = (
    lambda: _float("kernel_tile_scale", 0.25, 2.0, 0.25),
    lambda: _int("kernel_split", 1, 8),
)


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


# ---------------------------------------------------------------------------- exact figures


def _fraction(parts: Sequence[tuple[np.ndarray, np.ndarray]], tau: float) -> float:
    """P(sum of one draw from each independent part >= tau); a part is (values, probs)
    of its feasible points (an infeasible point is a miss)."""
    if any(len(v) == 0 for v, _ in parts):
        return 0.0
    maxes = [float(v.max()) for v, _ in parts]
    total = sum(maxes)
    pruned = []
    for (v, w), m in zip(parts, maxes, strict=True):
        keep = v >= tau - (total - m) - 1e-12
        u, inv = np.unique(v[keep], return_inverse=True)
        pruned.append((u, np.bincount(inv, weights=w[keep]), m))
    pruned.sort(key=lambda t: len(t[0]))
    while len(pruned) > 2:
        (x, px, mx), (y, py, my) = pruned[0], pruned[1]
        rest = sum(t[2] for t in pruned[2:])
        v = np.add.outer(x, y).ravel()
        w = np.multiply.outer(px, py).ravel()
        keep = v >= tau - rest - 1e-12
        u, inv = np.unique(v[keep], return_inverse=True)
        pruned = sorted(
            [(u, np.bincount(inv, weights=w[keep]), mx + my), *pruned[2:]],
            key=lambda t: len(t[0]),
        )
    (x, px, _), (y, py, _) = pruned
    suffix = np.concatenate([np.cumsum(py[::-1])[::-1], [0.0]])
    return float(np.sum(px * suffix[np.searchsorted(y, tau - x, side="left")]))


def _feasible(block: Block, lv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ok = block.fail == OK
    return lv[ok], block.probs[ok]


def _needle_fraction(blocks: Sequence[Block]) -> tuple[float, float]:
    """(needle fraction, log of the best feasible score before the offset)."""
    parts = [_feasible(b, b.lv) for b in blocks]
    best = sum(float(v.max()) for v, _ in parts)
    tau = best + math.log(WITHIN * (1.0 - 1e-9))
    return _fraction(parts, tau), best


def _shares(blocks: Sequence[Block]) -> dict[str, float]:
    """P(each failure class) of one random configuration (forbidden counted first)."""
    cdf = np.ones(5)
    for block in blocks:
        mass = np.bincount(block.fail, weights=block.probs, minlength=5)
        cdf = cdf * np.cumsum(mass)
    pmf = np.diff(np.concatenate([[0.0], cdf]))
    return {FAILURES.get(k, "ok"): float(pmf[k]) for k in range(5)}


def _calibrate(r: Recipe, target: float) -> float:
    """Set ``r.k`` to the shape exponent whose needle fraction is closest to ``target``
    (bisection on log k; the fraction grows with k); returns that fraction."""
    lo, hi = math.log(K_RANGE[0]), math.log(K_RANGE[1])
    best = (math.inf, 1.0, 0.0)
    for _ in range(14):
        mid = 0.5 * (lo + hi)
        r.k = math.exp(mid)
        frac, _ = _needle_fraction(r.blocks())
        miss = abs(math.log(max(frac, 1e-12) / target))
        if miss < best[0]:
            best = (miss, r.k, frac)
        if frac < target:
            lo = mid
        else:
            hi = mid
    r.k = best[1]
    return best[2]


# ---------------------------------------------------------------------------- the surface


class _Evaluator:
    """A recipe's blocks at its scale: lookups for ``evaluate`` and ``noise_sigma``."""

    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe
        self.blocks = recipe.blocks()
        self.lv = [b.lv for b in self.blocks]
        self.reasons = _reasons(recipe)

    def indices(self, config: Mapping[str, Any]) -> tuple[dict[str, int], list[int]]:
        codes = self.recipe.codes_from_config(config)
        return codes, [b.index(codes) for b in self.blocks]

    def value_of(self, idx: Sequence[int]) -> float:
        total = self.lv[0][idx[0]] + self.lv[1][idx[1]] + self.lv[2][idx[2]]
        return float(self.recipe.v0 * math.exp(total - self.recipe.offset))

    def evaluate(self, config: Mapping[str, Any]) -> Result:
        codes, idx = self.indices(config)
        fails = [int(b.fail[i]) for b, i in zip(self.blocks, idx, strict=True)]
        worst = max(fails)
        value = self.value_of(idx)
        batch = float(self.blocks[0].batch[idx[0]])  # type: ignore[index]
        latency = 1000.0 * batch / value
        if worst == OK:
            return Result(value=value, latency_ms=latency)
        where = fails.index(worst)
        reason = self.reasons[(worst, where)](config)
        if worst == WRONG:  # fast, but wrong
            return Result(latency_ms=latency, failure="wrong_output", reason=reason)
        failure = "config_rejected" if worst == FORBIDDEN else FAILURES[worst]
        return Result(failure=failure, reason=reason)

    def noise_sigma(self, config: Mapping[str, Any]) -> float:
        _, idx = self.indices(config)
        return float(self.blocks[0].sigma[idx[0]])  # type: ignore[index]

    def deficits(self, config: Mapping[str, Any]) -> list[float]:
        _, idx = self.indices(config)
        return [b.best - float(b.lv[i]) for b, i in zip(self.blocks, idx, strict=True)]


def _reasons(r: Recipe) -> dict[tuple[int, int], Callable[[Mapping[str, Any]], str]]:
    mem, batch, trap = r.roles["mem"], r.roles["batch"], r.roles["trap"]
    a, b = r.roles["a"], r.roles.get("b")
    child = r.roles.get("child")
    return {
        (OOM, 0): lambda c: (
            f"CUDA out of memory: {mem}={c[mem]} leaves no room for the "
            f"activations of {batch}={c[batch]}"
            + (f" and a {child}={c[child]} draft" if child and child in c else "")
        ),
        (CRASHED, 0): lambda c: (
            f"illegal memory access in the draft tree ({child}={c.get(child)}, {batch}={c[batch]})"
        ),
        (FORBIDDEN, 0): lambda c: "forbidden: deep_speculation_large_batch",
        (CRASHED, 1): lambda c: f"kernel launch failed: {a}={c[a]} with {b}={c.get(b)}",
        (FORBIDDEN, 1): lambda c: f"forbidden: {a}={c[a]} with {b}={c.get(b)}",
        (WRONG, 1): lambda c: (
            f"greedy output differs from the reference ({trap}={c[trap]}, {a}={c[a]})"
        ),
    }


@dataclass(frozen=True)
class GeneratedSurface:
    """One generated surface: its space file, evaluator, noise model and exact figures."""

    name: str
    level: str
    seed: int
    space_data: dict[str, Any]
    optimum: float
    optimum_config: dict[str, Any]
    needle_fraction: float
    description: str
    baseline_value: float
    shares: dict[str, float]
    """P(forbidden / cuda_oom / crashed / wrong_output / ok) of a random configuration."""
    n_levers: int
    recipe: Recipe = field(compare=False, repr=False)
    evaluator: _Evaluator = field(compare=False, repr=False)

    def evaluate(self, config: Mapping[str, Any]) -> Result:
        """Launch one configuration (a TrialConfig of ``space``)."""
        return self.evaluator.evaluate(config)

    def noise_sigma(self, config: Mapping[str, Any]) -> float:
        """Lognormal sigma of one measurement of ``config``: larger at high batch and near
        the out-of-memory edge (1-6%; a flat 3% for the held-out preset)."""
        return self.evaluator.noise_sigma(config)

    def block_deficits(self, config: Mapping[str, Any]) -> list[float]:
        """Log deficit of ``config`` against the best feasible point of each block (numeric,
        categorical, main effects): the blocks are independent, so for a feasible
        configuration they sum to ``log(optimum / value)``."""
        return self.evaluator.deficits(config)

    @cached_property
    def space(self) -> Any:
        """The parsed ``SearchSpace`` (``autotune.space.loader.parse_space``)."""
        from autotune.space.loader import parse_space

        return parse_space(copy.deepcopy(self.space_data), file=f"<generated {self.name}>")


def _optimum(r: Recipe, blocks: Sequence[Block]) -> tuple[dict[str, int], list[float]]:
    codes: dict[str, int] = {n: r.lever(n).code(r.baseline[n]) for n in r.inert}
    maxes = []
    for block in blocks:
        lv = np.where(block.fail == OK, block.lv, -np.inf)
        i = int(np.argmax(lv))
        maxes.append(float(lv[i]))
        if block.shape:
            for name, code in zip(block.names, np.unravel_index(i, block.shape), strict=True):
                codes[name] = int(code)
    return codes, maxes


def _baseline_ratio(ev: _Evaluator, config: Mapping[str, Any], optimum: float) -> float:
    result = ev.evaluate(config)
    return result.value / optimum if result.failure is None else 0.0


def _nudge_baseline(r: Recipe, ev: _Evaluator, optimum: float) -> None:
    """Move the baseline's batch and main-effect levers until it scores 2-20% of the
    optimum (greedy, one lever a step, aiming at 7.5%)."""
    movable = [r.roles["batch"], r.roles["mem"], *r.main]
    goal = math.log(0.075)
    for _ in range(12):
        codes = {n: r.lever(n).code(v) for n, v in r.baseline.items()}
        ratio = _baseline_ratio(ev, r.config_from_codes(codes), optimum)
        if BASELINE_BAND[0] * 1.2 <= ratio <= BASELINE_BAND[1] * 0.9:
            return
        best = (abs(math.log(max(ratio, 1e-12)) - goal), None, 0)
        for name in movable:
            for code in range(r.lever(name).n):
                trial = dict(codes, **{name: code})
                ratio_t = _baseline_ratio(ev, r.config_from_codes(trial), optimum)
                if ratio_t <= 0:
                    continue
                miss = abs(math.log(ratio_t) - goal)
                if miss < best[0] - 1e-9:
                    best = (miss, name, code)
        if best[1] is None:
            return
        r.baseline[best[1]] = r.lever(best[1]).values[best[2]]


def _finish(r: Recipe, *, calibrate: bool) -> GeneratedSurface | None:
    """Scale, optimum, baseline and figures of a recipe; None when it misses its level's
    requirements (the caller draws again)."""
    if calibrate:
        frac = _calibrate(r, TARGETS[r.level])
        lo, hi = ACCEPT[r.level]
        if not lo <= frac <= hi:
            return None
    blocks = r.blocks()
    frac, _ = _needle_fraction(blocks)
    codes, maxes = _optimum(r, blocks)
    if calibrate:
        r.offset = sum(maxes)
    ev = _Evaluator(r)
    optimum_config = r.config_from_codes(codes)
    optimum = ev.evaluate(optimum_config).value
    if calibrate:
        if not _structure_ok(r, codes, blocks):
            return None
        _nudge_baseline(r, ev, optimum)
    base_codes = {n: r.lever(n).code(v) for n, v in r.baseline.items()}
    base_config = r.config_from_codes(base_codes)
    base = ev.evaluate(base_config)
    if base.failure is not None or (
        calibrate and not BASELINE_BAND[0] <= base.value / optimum <= BASELINE_BAND[1]
    ):
        return None
    shares = _shares(blocks)
    return GeneratedSurface(
        name=r.name,
        level=r.level,
        seed=r.seed,
        space_data=r.space_data(),
        optimum=optimum,
        optimum_config=optimum_config,
        needle_fraction=frac,
        description=_describe(r, base.value / optimum, shares),
        baseline_value=base.value,
        shares=shares,
        n_levers=len(r.levers),
        recipe=r,
        evaluator=ev,
    )


def _structure_ok(r: Recipe, codes: Mapping[str, int], blocks: Sequence[Block]) -> bool:
    """The level's ingredients hold at the optimum and are reachable at random."""
    p = r.p
    a, b, c = r.roles["a"], r.roles.get("b"), r.roles.get("c")
    if r.level in ("medium", "heldout"):
        assert b is not None
        if (codes[a], codes[b]) != p["needle2"][:2]:
            return False  # the pairwise needle must be what the optimum needs
    if r.level == "hard":
        assert b is not None and c is not None
        if (codes[a], codes[b], codes[c]) != p["needle3"][:3]:
            return False
    shares = _shares(blocks)
    return shares["cuda_oom"] >= 0.03 and shares["wrong_output"] >= 0.02 and shares["ok"] >= 0.2


def _describe(r: Recipe, base_share: float, shares: Mapping[str, float]) -> str:
    p = r.p
    a, b, c = r.role("a"), r.role("b"), r.role("c")
    trap = r.role("trap")
    assert a is not None and trap is not None
    parts = [f"generated {r.level} surface, seed {r.seed}: {len(r.levers)} levers"]
    if "needle3" in p and b is not None and c is not None:
        na, nb, nc, gain = p["needle3"]
        parts.append(
            f"3-way needle {a.name}={a.values[na]} x {b.name}={b.values[nb]} x "
            f"{c.name}={c.values[nc]} (x{gain:.2f})"
        )
    elif "needle2" in p and b is not None:
        na, nb, gain = p["needle2"]
        parts.append(f"needle {a.name}={a.values[na]} x {b.name}={b.values[nb]} (x{gain:.2f})")
    parts.append(f"trap {trap.name}={trap.values[-1]} (x{p['trap_gain']:.2f}, wrong output)")
    parts.append(
        f"baseline at {100 * base_share:.1f}% of the optimum, {100 * shares['cuda_oom']:.0f}% "
        "of random configurations run out of memory"
    )
    if r.upgrades:
        parts.append("engine upgrade " + ", ".join(map(str, r.upgrades)))
    return "; ".join(parts)


# ---------------------------------------------------------------------------- public API


def generate(seed: int, *, level: str) -> GeneratedSurface:
    """The surface ``gen-<level>-<seed>``: same arguments, same surface."""
    if level not in LEVELS + PRESETS:
        raise ValueError(f"unknown level {level!r} (one of {', '.join(LEVELS + PRESETS)})")
    for attempt in range(40):
        surface = _finish(_draw(seed, level, attempt), calibrate=True)
        if surface is not None:
            return surface
    raise RuntimeError(f"no {level} surface for seed {seed} met its level in 40 draws")


def family_names(n: int = 30, *, first_seed: int = 0) -> list[str]:
    """The names ``family`` returns, without building them: levels in turn, seeds from
    ``first_seed`` (``gen-easy-0, gen-medium-0, gen-hard-0, gen-easy-1, ...``)."""
    return [f"gen-{LEVELS[i % 3]}-{first_seed + i // 3}" for i in range(n)]


def family(n: int = 30, *, first_seed: int = 0) -> list[GeneratedSurface]:
    """``n`` surfaces, the three levels in turn (30: ten of each)."""
    return [by_name(name) for name in family_names(n, first_seed=first_seed)]


def by_name(name: str) -> GeneratedSurface:
    """``gen-<level>-<seed>``, optionally followed by ``-up<k>`` upgrades (``perturb``)."""
    match = NAME_RE.fullmatch(name)
    if match is None:
        raise ValueError(f"not a generated surface name: {name!r} (gen-<level>-<seed>[-up<k>])")
    surface = generate(int(match.group(2)), level=match.group(1))
    for up in re.findall(r"-up(\d+)", match.group(3)):
        surface = perturb(surface, int(up))
    return surface


def perturb(surface: GeneratedSurface, seed: int) -> GeneratedSurface:
    """A seeded "engine upgrade": the same levers (a main-effect categorical may gain or
    lose a choice), every smooth effect shifted by 10-30% either way, the OOM threshold
    moved by one to two and a half memory steps, maybe one needle moved to a neighbouring
    choice. The scale and the score's offset are kept, the optimum and the needle fraction
    recomputed, so the old best is a good but not exact start."""
    for attempt in range(20):
        rng = np.random.default_rng(
            [61, seed, surface.seed, (LEVELS + PRESETS).index(surface.level), attempt]
        )
        r = copy.deepcopy(surface.recipe)
        r.upgrades = (*r.upgrades, seed)
        _upgrade(r, rng)
        out = _finish(r, calibrate=False)
        if out is None:
            continue
        old = out.evaluate(surface.optimum_config)
        if out.optimum_config == surface.optimum_config or old.failure is not None:
            continue
        if not 0.5 <= old.value / out.optimum < 0.999:
            continue
        return out
    raise RuntimeError(f"no upgrade {seed} of {surface.name} kept its old best launchable")


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


def stats(surfaces: Sequence[GeneratedSurface]) -> list[dict[str, Any]]:
    """One row per surface (for the docs): levers, needle fraction, baseline share,
    failure shares."""
    return [
        {
            "name": s.name,
            "levers": s.n_levers,
            "needle_fraction": s.needle_fraction,
            "baseline_share": s.baseline_value / s.optimum,
            **{k: v for k, v in s.shares.items()},
            "k": s.recipe.k,
        }
        for s in surfaces
    ]


if __name__ == "__main__":
    import sys
    import time

    count = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    started = time.perf_counter()
    fam = family(count)
    took = time.perf_counter() - started
    for row in stats(fam):
        print(
            f"{row['name']:<16} {row['levers']:>2} levers"
            f"  needle {100 * row['needle_fraction']:7.4f}%"
            f"  baseline {100 * row['baseline_share']:5.1f}%  oom {100 * row['cuda_oom']:4.1f}%"
            f"  crashed {100 * row['crashed']:4.1f}%  wrong {100 * row['wrong_output']:4.1f}%"
            f"  forbidden {100 * row['forbidden']:4.1f}%  k={row['k']:.2f}"
        )
    print(f"{count} surfaces in {took:.2f} s ({1000 * took / count:.0f} ms each)")
