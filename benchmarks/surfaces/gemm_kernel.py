"""Triton-style matmul kernel autotuning (M=256, N=2048, K=8192 bf16, 132 SMs): TFLOP/s.

A synthetic surface for ``benchmarks/sample_efficiency.py`` with the traits of kernel
autotuning: the tile shape, warps and pipeline stages interact through shared memory,
registers and tensor-core efficiency; few output tiles make split-K or stream-K pay, whose
partial sums need a reduction; fp16 accumulation is faster and halves the accumulator
registers but gives wrong results unless each split accumulates at most 1,024 of K.
Crashes: shared memory over 227 KiB or more than 510 registers per thread
(``out_of_resources``, at launch); wrong output as above. Forbidden rules (known before
launch) are in ``gemm_kernel.yaml``. The formula is vectorised with numpy so that
``true_optimum`` enumerates all 144,000 combinations exactly in well under a second.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

M, N, K = 256, 2048, 8192
SMS = 132
SMEM_BYTES = 232_448  # 227 KiB usable shared memory per SM
REGS_PER_SM = 65_536
MAX_REGS = 255  # per thread before spilling
SPILL_LIMIT = 510  # the compiler gives up past this
PEAK_PER_SM = 990e12 / SMS  # dense bf16 tensor-core FLOP/s
HBM = 3.35e12  # bytes/s
LAUNCH_S = 4e-6
STRATEGIES = ("data_parallel", "split_k", "stream_k")

BLOCK_M = (16, 32, 64, 128, 256)
BLOCK_N = (16, 32, 64, 128, 256)
BLOCK_K = (16, 32, 64, 128)
WARPS = (1, 2, 4, 8, 16)
STAGES = (1, 2, 3, 4, 5, 6)
SPLITS = (2, 4, 8, 16)
GROUP_M = (1, 4, 8, 16)
ACC = ("fp32", "fp16")


@dataclass(frozen=True)
class Result:
    """One launch: the score (TFLOP/s), its latency, or why it failed."""

    value: float = 0.0
    latency_ms: float | None = None
    failure: str | None = None
    reason: str = ""


def _forbidden(bm: Any, bn: Any, w: Any, strategy: Any, acc16: Any) -> Any:
    """The rules of ``gemm_kernel.yaml`` (the harness never launches these)."""
    return (bm * bn < 128 * w) | ((strategy == 2) & acc16)


def score(
    bm: Any, bn: Any, bk: Any, w: Any, st: Any, strategy: Any, sk: Any, gm: Any, acc16: Any
) -> dict[str, Any]:
    """Vectorised model: arrays (or scalars) in, arrays of tflops/seconds/failure masks out.

    ``strategy`` is an index into STRATEGIES; ``sk`` is the split count (1 unless split-K).
    """
    bm, bn, bk, w, st, sk, gm = (np.asarray(x, dtype=float) for x in (bm, bn, bk, w, st, sk, gm))
    strategy = np.asarray(strategy)
    acc16 = np.asarray(acc16, dtype=bool)
    smem = (bm + bn) * bk * 2.0 * st
    acc_regs = bm * bn / (32.0 * w) * np.where(acc16, 0.5, 1.0)
    regs = acc_regs + (bm + bn) * bk / (64.0 * w) + 32.0
    oom = (smem > SMEM_BYTES) | (regs > SPILL_LIMIT)
    spill = 1.0 + 2.0 * np.maximum(regs - MAX_REGS, 0.0) / MAX_REGS
    occ = np.minimum.reduce(
        [
            np.floor(SMEM_BYTES / np.maximum(smem, 1.0)),
            np.floor(REGS_PER_SM / (np.minimum(regs, MAX_REGS) * 32.0 * w)),
            np.floor(64.0 / w),
            np.full_like(bm, 8.0),
        ]
    )
    occ = np.maximum(occ, 1.0)
    tiles_m = np.ceil(M / bm)
    tiles = tiles_m * np.ceil(N / bn)
    splits = np.where(strategy == 1, sk, 1.0)
    k_per = K / splits
    total_tiles = tiles * splits
    # tensor-core efficiency: reuse of a tile, work per warp, K-loop overhead
    reuse = bm * bn / (bm + bn)
    eff = reuse / (reuse + 24.0)
    eff = eff * np.exp(-0.5 * (np.log2(bm * bn / w / 1024.0) / 2.5) ** 2)
    eff = eff * bk / (bk + 12.0) * np.where(acc16, 1.08, 1.0) / spill
    share = (1.0 + 0.25 * (np.minimum(occ, 4.0) - 1.0)) / occ  # SM shared by occ blocks
    t_compute = 2.0 * bm * bn * k_per / (PEAK_PER_SM * eff * share)
    slots = SMS * occ
    active = np.minimum(total_tiles, slots)
    dram = 1.0 / np.sqrt(np.minimum(gm, tiles_m))  # L2 reuse from grouped ordering
    t_memory = (bm + bn) * k_per * 2.0 * (0.2 + 0.5 * dram) * active / HBM
    overlap = np.minimum(1.0, (st - 1.0) / 2.0)
    t_tile = (
        np.maximum(t_compute, t_memory)
        + (1.0 - overlap) * np.minimum(t_compute, t_memory)
        + 0.3e-6 * st
    )
    waves = np.where(
        strategy == 2, np.maximum(total_tiles / slots, 1.0), np.ceil(total_tiles / slots)
    )
    seconds = waves * t_tile * np.where(strategy == 2, 1.06, 1.0) + LAUNCH_S
    seconds = seconds + np.where(strategy == 1, 2.0 * splits * M * N * 4.0 / HBM + 4e-6, 0.0)
    seconds = seconds + np.where(strategy == 2, 3e-6, 0.0)
    wrong = acc16 & (k_per > 1024)
    return {
        "tflops": 2.0 * M * N * K / seconds / 1e12,
        "seconds": seconds,
        "out_of_resources": oom,
        "wrong_output": wrong,
        "smem": smem,
        "regs": regs,
    }


def _args(config: Mapping[str, Any]) -> tuple[Any, ...]:
    strategy = STRATEGIES.index(str(config["strategy"]))
    return (
        int(config["block_m"]),
        int(config["block_n"]),
        int(config["block_k"]),
        int(config["num_warps"]),
        int(config["num_stages"]),
        strategy,
        int(config.get("split_k", 1)) if strategy == 1 else 1,
        int(config["group_m"]),
        config["acc_dtype"] == "fp16",
    )


def evaluate(config: Mapping[str, Any]) -> Result:
    """Launch one configuration (a space TrialConfig)."""
    out = score(*_args(config))
    if bool(out["out_of_resources"]):
        return Result(
            failure="out_of_resources",
            reason=f"out of resources: shared memory {float(out['smem']):.0f} B, "
            f"{float(out['regs']):.0f} registers per thread",
        )
    if bool(out["wrong_output"]):
        return Result(failure="wrong_output", reason="result differs from the fp32 reference")
    return Result(value=float(out["tflops"]), latency_ms=1000.0 * float(out["seconds"]))


def _grid() -> dict[str, np.ndarray]:
    strategies = [(0, 1), *[(1, s) for s in SPLITS], (2, 1)]
    rows = list(
        itertools.product(BLOCK_M, BLOCK_N, BLOCK_K, WARPS, STAGES, strategies, GROUP_M, (0, 1))
    )
    arr = np.array([(a, b, c, d, e, s[0], s[1], g, f) for a, b, c, d, e, s, g, f in rows])
    names = ("bm", "bn", "bk", "w", "st", "strategy", "sk", "gm", "acc16")
    return {n: arr[:, i] for i, n in enumerate(names)}


def _config(g: Mapping[str, np.ndarray], i: int) -> dict[str, Any]:
    strategy = STRATEGIES[int(g["strategy"][i])]
    config: dict[str, Any] = {
        "block_m": int(g["bm"][i]),
        "block_n": int(g["bn"][i]),
        "block_k": int(g["bk"][i]),
        "num_warps": int(g["w"][i]),
        "num_stages": int(g["st"][i]),
        "strategy": strategy,
    }
    if strategy == "split_k":
        config["split_k"] = int(g["sk"][i])
    config["group_m"] = int(g["gm"][i])
    config["acc_dtype"] = "fp16" if g["acc16"][i] else "fp32"
    return config


def _outcomes(g: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """TFLOP/s of every grid row (-inf where it crashes, is wrong or is forbidden), and
    that mask."""
    out = score(**{k: (v.astype(bool) if k == "acc16" else v) for k, v in g.items()})
    bad = out["out_of_resources"] | out["wrong_output"]
    bad |= _forbidden(g["bm"], g["bn"], g["w"], g["strategy"], g["acc16"].astype(bool))
    return np.where(bad, -math.inf, out["tflops"]), bad


def true_optimum() -> tuple[float, dict[str, Any]]:
    """Best launchable, correct configuration, by exhaustive enumeration."""
    g = _grid()
    values, _ = _outcomes(g)
    i = int(np.argmax(values))
    return float(values[i]), _config(g, i)


def stats() -> dict[str, float]:
    """Shares of the enumerated grid (for the docs): crashes, wrong, near-optimal."""
    g = _grid()
    out = score(**{k: (v.astype(bool) if k == "acc16" else v) for k, v in g.items()})
    forb = _forbidden(g["bm"], g["bn"], g["w"], g["strategy"], g["acc16"].astype(bool))
    ok = ~(out["out_of_resources"] | out["wrong_output"] | forb)
    best = out["tflops"][ok].max()
    return {
        "configs": float(len(forb)),
        "forbidden": float(forb.mean()),
        "out_of_resources": float((out["out_of_resources"] & ~forb).mean()),
        "wrong_output": float((out["wrong_output"] & ~out["out_of_resources"] & ~forb).mean()),
        "within_95": float((ok & (out["tflops"] >= 0.95 * best)).mean()),
        "within_90": float((ok & (out["tflops"] >= 0.90 * best)).mean()),
    }
