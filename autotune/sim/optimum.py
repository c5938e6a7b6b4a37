"""Exact search of the lever grid for the best correct configuration under the perf model.

The full grid has ~10^13 points; the search enumerates it after removing what provably
cannot matter (each argument holds because the closed form is monotone in decode step time,
in prefill time, in memory need and in the batch limit):

* all-reduce settings: NCCL settings not dominated in latency at every message size in
  play, each with and without the PCIe IPC all-reduce (IPC serves decode-size messages,
  NCCL the rest);
* MoE runners and sm_120 attention kernels: only those not dominated in decode step time,
  prefill time and memory need (per checkpoint: the checkpoint decides the weights' size);
* ``disable_overlap_schedule``, breakable decode graphs: dominated (they only add time);
* ``cuda_graph_max_bs_decode`` / ``max_running_requests``: values above C act like C (the
  running batch never exceeds C) but cost memory, so only multiples of 8 up to C are tried
  (plus the baseline's 48, kept for fewer changed levers);
* ``chunked_prefill_size``: per (runner, attention, all-reduce, memory) the feasible chunk
  with the shortest prefill;
* configurations that reach the same (decode settings, batch limit, prefill time) are
  evaluated once.

Among equally fast settings the one that changes the fewest levers from the baseline wins.

This module sits above the model (it only evaluates it); :func:`true_optimum` is the
memoised entry point (it used to live in ``perf_model``, which made the two import each other).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from autotune.sim import perf_model as pm
from autotune.sim.levers import (
    BASELINE,
    CATEGORIES,
    GRAPH_BS_LISTS,
    MEM_FRACTIONS,
    active_levers,
    changed_levers,
    config_from_levers,
    pd_configs,
    violations,
)

Levers = dict[str, object]


@dataclass(frozen=True)
class Optimum:
    """The best correct lever setting and what the model expects of it."""

    levers: dict[str, object] = field(hash=False, compare=False)
    throughput: float
    tpot_ms: float
    evaluated: int

    @property
    def changed(self) -> list[str]:
        return changed_levers(self.levers)


def _dominance_front(options: Sequence[tuple[Levers, Sequence[float]]]) -> list[Levers]:
    """Options whose cost vector is not dominated (ties keep the first, baseline-first)."""
    front: list[tuple[Levers, Sequence[float]]] = []
    for opt, vec in options:
        dominated = any(
            all(a <= b * (1 + 1e-12) + 1e-15 for a, b in zip(fv, vec, strict=True))
            for _, fv in front
        )
        if dominated:
            continue
        front = [
            (o, v)
            for o, v in front
            if not all(a <= b * (1 + 1e-12) + 1e-15 for a, b in zip(vec, v, strict=True))
        ]
        front.append((opt, vec))
    return [o for o, _ in front]


def _nccl_options(concurrency: int, input_len: int) -> list[Levers]:
    sizes = [t * pm.HIDDEN * 2 for t in range(1, 5 * concurrency + 1)]
    sizes += [min(c, input_len) * pm.HIDDEN * 2 for c in range(1024, 16385, 1024)]
    candidates: list[Levers] = []
    for proto in ("unset", "LL", "Simple"):  # LL128 serves wrong text without IPC
        for algo in ("unset", "Tree"):
            candidates.append({"nccl_proto": proto, "nccl_algo": algo})
            for ch in (1, *range(3, 33)):
                candidates.append(
                    {
                        "nccl_proto": proto,
                        "nccl_algo": algo,
                        "nccl_channels": True,
                        "nccl_min_nchannels": ch,
                        "nccl_max_nchannels": ch,
                    }
                )
    opts = []
    for cand in candidates:
        cfg = config_from_levers({**BASELINE, **cand})
        opts.append((cand, [pm.allreduce_seconds(cfg, n) for n in sizes]))
    return _dominance_front(opts)


def _profile(lv: Levers, concurrency: int, input_len: int) -> list[float]:
    """Costs that decide everything downstream of a MoE runner or an attention kernel:
    decode step times (every batch up to C, spec off and 1-4 steps, graphs on and off),
    prefill time at every chunk size, memory need (decode and prefill)."""
    vec: list[float] = []
    specs: list[Levers] = [{"speculative": "off"}]
    specs += [{"speculative": "eagle", "speculative_num_steps": s} for s in (1, 2, 3, 4)]
    graphs: list[Levers] = [
        {"cuda_graph_backend_decode": "full", "cuda_graph_max_bs_decode": 256},
        {"cuda_graph_backend_decode": "disabled"},
    ]
    for spec in specs:
        for graph in graphs:
            dec = config_from_levers({**lv, **spec, **graph}, mode="decode")
            vec += [pm.decode_step_seconds(dec, b) for b in range(1, concurrency + 1)]
            vec.append(pm.nonstatic_need_bytes(dec))
    for chunk in range(1024, 16385, 1024):
        pre = config_from_levers({**lv, "chunked_prefill_size": chunk}, mode="prefill")
        vec.append(pm.prefill_seconds(pre, input_len))
        vec.append(pm.nonstatic_need_bytes(pre))
    return vec


def _runner_options(concurrency: int, input_len: int) -> list[Levers]:
    out: list[Levers] = []
    for ckpt in CATEGORIES["checkpoint"]:
        opts = []
        for runner in CATEGORIES["moe_runner_backend"]:
            cand: Levers = {"moe_runner_backend": runner, "checkpoint": ckpt}
            if violations(cand):
                continue
            lv = {**BASELINE, **cand, "sm120_flashmla_backend": "flashinfer"}
            opts.append((cand, _profile(lv, concurrency, input_len)))
        out += _dominance_front(opts)
    return out


def _attention_options(concurrency: int, input_len: int) -> list[Levers]:
    cands: list[Levers] = [
        {"sm120_flashmla_backend": backend} for backend in CATEGORIES["sm120_flashmla_backend"]
    ]
    cands.insert(1, {"sm120_flashmla_backend": "flashinfer", "sm120_direct_swa_kv": True})
    ordered = sorted(cands, key=lambda c: c["sm120_flashmla_backend"] != "triton")
    base = {**BASELINE, "moe_runner_backend": "flashinfer_mxfp4"}
    opts = [(cand, _profile({**base, **cand}, concurrency, input_len)) for cand in ordered]
    return _dominance_front(opts)


def _near_baseline(values: Iterable[float], base: float) -> list[float]:
    return sorted(values, key=lambda v: (abs(v - base), v))


def search(
    *, concurrency: int = 16, input_len: int, output_len: int, deployment: str = "pd"
) -> Optimum:
    """Best correct configuration of the lever grid (see module docstring)."""
    c = concurrency
    top = max(8, min(256, -(-c // 8) * 8))
    gbs_cands = [8, *range(16, top + 1, 8)] if top >= 16 else [8]
    mrr_cands = [48, *[m for m in range(8, min(128, top) + 1, 8) if m != 48]]
    nccl_front = _nccl_options(c, input_len)
    ar_front: list[Levers] = [
        {**nccl, "pcie_ipc_allreduce": ipc} for ipc in (False, True) for nccl in nccl_front
    ]
    runners = _runner_options(c, input_len)
    attns = _attention_options(c, input_len)
    specs: list[Levers] = [{"speculative": "off"}]
    specs += [
        {"speculative": "eagle", "speculative_num_steps": s, "prefill_speculative": p}
        for s in (3, 1, 2, 4)
        for p in (False, True)
    ]
    graphs: list[Levers] = [
        {
            "cuda_graph_backend_decode": "full",
            "cuda_graph_bs_decode": "unset",
            "cuda_graph_max_bs_decode": g,
        }
        for g in gbs_cands
    ]
    graphs += [
        {"cuda_graph_backend_decode": "full", "cuda_graph_bs_decode": name}
        for name, sizes in GRAPH_BS_LISTS.items()
        if max(sizes) <= top
    ]
    graphs.append({"cuda_graph_backend_decode": "disabled"})
    mems = _near_baseline(MEM_FRACTIONS, float(BASELINE["mem_fraction_static"]))  # type: ignore[arg-type]
    chunks = sorted(range(1024, 16385, 1024), key=lambda v: (abs(v - 8192), v))
    chunk_cache: dict[tuple[int, int, int, float, str, bool], tuple[int, float] | None] = {}
    fits_cache: dict[tuple[int, int, int, int, str, float], int | None] = {}
    seen: set[tuple[object, ...]] = set()
    results: list[tuple[float, int, Levers]] = []
    evaluated = 0
    for ri, runner in enumerate(runners):
        for ti, attn in enumerate(attns):
            for si, spec in enumerate(specs):
                pspec = bool(spec.get("prefill_speculative"))
                for gi, graph in enumerate(graphs):
                    for alloc in CATEGORIES["pytorch_alloc_conf"]:
                        for mem in mems:
                            lv: Levers = {
                                **BASELINE,
                                **runner,
                                **attn,
                                **spec,
                                **graph,
                                "mem_fraction_static": mem,
                                "pytorch_alloc_conf": alloc,
                            }
                            fk = (ri, ti, si, gi, str(alloc), mem)
                            if fk not in fits_cache:
                                dec = config_from_levers(lv, mode="decode")
                                fits_cache[fk] = (
                                    None
                                    if pm.startup_failure(dec) is not None
                                    else pm.kv_slots(dec)
                                )
                            slots = fits_cache[fk]
                            if slots is None:
                                continue
                            for ai, ar in enumerate(ar_front):
                                ck = (ai, ri, ti, mem, str(alloc), pspec)
                                if ck not in chunk_cache:
                                    chunk_cache[ck] = _best_chunk({**lv, **ar}, chunks, input_len)
                                best_chunk = chunk_cache[ck]
                                if best_chunk is None:
                                    continue
                                for mrr in mrr_cands:
                                    limit = min(c, slots, mrr)
                                    key = (ai, ri, ti, si, gi, limit, round(best_chunk[1], 12))
                                    if key in seen:
                                        continue
                                    seen.add(key)
                                    cand = active_levers(
                                        {
                                            **lv,
                                            **ar,
                                            "max_running_requests": mrr,
                                            "chunked_prefill_size": best_chunk[0],
                                        }
                                    )
                                    pre, dec = pd_configs(cand)
                                    thr = pm.expected_output_throughput(
                                        dec,
                                        prefill=pre,
                                        concurrency=c,
                                        input_len=input_len,
                                        output_len=output_len,
                                        deployment=deployment,
                                    )
                                    evaluated += 1
                                    results.append((thr, len(changed_levers(cand)), cand))
    best_thr = max(r[0] for r in results)
    ties = [r for r in results if r[0] >= best_thr * (1 - 1e-9)]
    thr, _, levers = min(ties, key=lambda r: r[1])
    pre, dec = pd_configs(levers)
    tpot = pm.expected_tpot_ms(
        dec,
        prefill=pre,
        concurrency=c,
        input_len=input_len,
        output_len=output_len,
        deployment=deployment,
    )
    return Optimum(levers=levers, throughput=thr, tpot_ms=tpot, evaluated=evaluated)


def _best_chunk(lv: Levers, chunks: list[int], input_len: int) -> tuple[int, float] | None:
    """Feasible prefill chunk with the shortest prefill of one request (baseline-first ties)."""
    best: tuple[int, float] | None = None
    for chunk in chunks:
        pre = config_from_levers({**lv, "chunked_prefill_size": chunk}, mode="prefill")
        if pm.startup_failure(pre) is not None:
            continue
        t = pm.prefill_seconds(pre, input_len)
        if best is None or t < best[1] * (1 - 1e-12):
            best = (chunk, t)
    return best


@lru_cache(maxsize=32)
def true_optimum(
    *, concurrency: int = 16, input_len: int, output_len: int, deployment: str = "pd"
) -> Optimum:
    """Best correct lever setting of the lever grid under this model (exact, memoised)."""
    return search(
        concurrency=concurrency,
        input_len=input_len,
        output_len=output_len,
        deployment=deployment,
    )
