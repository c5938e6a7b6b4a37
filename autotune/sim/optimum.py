"""Exact search of the lever grid for the best correct configuration under the perf model.

The full grid has ~10^11 points; the search enumerates it after removing what provably
cannot matter (each argument holds because the closed form is monotone in step time, in
prefill time and in the batch limit):

* all-reduce settings: only those not dominated in latency at every message size in play;
* attention settings: only those not dominated in layer time at every batch up to C;
* ``cuda_graph_max_bs`` / ``max_running_requests``: values above C act like C (the running
  batch never exceeds C) but cost memory, so only multiples of 8 up to C are tried
  (plus the baseline's 48, kept for fewer changed levers);
* ``chunked_prefill_size``: per (runner, checkpoint, all-reduce, memory) the feasible chunk
  with the shortest prefill;
* configurations that reach the same (decode settings, batch limit, prefill time) are
  evaluated once.

Among equally fast settings the one that changes the fewest levers from the baseline wins.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from autotune.sim import perf_model as pm
from autotune.sim.levers import (
    BASELINE,
    CATEGORIES,
    MEM_FRACTIONS,
    active_levers,
    changed_levers,
    config_from_levers,
    violations,
)


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


def _dominance_front(
    options: list[tuple[dict[str, object], list[float]]],
) -> list[dict[str, object]]:
    """Options whose cost vector is not dominated (ties keep the first, baseline-first)."""
    front: list[tuple[dict[str, object], list[float]]] = []
    for opt, vec in options:
        dominated = any(
            all(a <= b * (1 + 1e-12) for a, b in zip(fv, vec, strict=True)) for _, fv in front
        )
        if dominated:
            continue
        front = [
            (o, v)
            for o, v in front
            if not all(a <= b * (1 + 1e-12) for a, b in zip(vec, v, strict=True))
        ]
        front.append((opt, vec))
    return [o for o, _ in front]


def _allreduce_options(concurrency: int, input_len: int) -> list[dict[str, object]]:
    sizes = [t * pm.HIDDEN * 2 for t in range(1, 5 * concurrency + 1)]
    sizes += [min(c, input_len) * pm.HIDDEN * 2 for c in range(1024, 16385, 1024)]
    opts: list[tuple[dict[str, object], list[float]]] = []
    candidates: list[dict[str, object]] = [{"pcie_ipc_allreduce": True}]
    for proto in ("unset", "LL", "Simple"):  # LL128 serves wrong text
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
    for cand in candidates:
        cfg = config_from_levers({**BASELINE, **cand})
        opts.append((cand, [pm.allreduce_seconds(cfg, n) for n in sizes]))
    return _dominance_front(opts)


def _attention_options(graph: bool, draft: int, concurrency: int) -> list[dict[str, object]]:
    base = {**BASELINE, "cuda_graph": graph, "cuda_graph_max_bs": 256}
    splits = CATEGORIES["triton_attention_num_kv_splits"]
    ordered = [8, *[s for s in splits if s != 8]]  # baseline first
    cands: list[dict[str, object]] = [
        {"static_kv_splits": st, "triton_attention_num_kv_splits": s}
        for st in (False, True)
        for s in ordered
    ]
    opts = []
    for cand in cands:
        dec = config_from_levers({**base, **cand}, mode="decode")
        vec = [
            pm._attention_layer_seconds(dec, b, d)
            for b in range(1, concurrency + 1)
            for d in sorted({1, draft})
        ]
        opts.append((cand, vec))
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
    ar_front = _allreduce_options(c, input_len)
    runners = [
        (r, k)
        for r in CATEGORIES["moe_runner_backend"]
        for k in CATEGORIES["checkpoint"]
        if not violations({"moe_runner_backend": r, "checkpoint": k})
    ]
    specs: list[dict[str, object]] = [{"speculative": "off"}]
    specs += [{"speculative": "eagle", "speculative_num_steps": s} for s in (3, 1, 2, 4)]
    graphs: list[dict[str, object]] = [
        {"cuda_graph": True, "cuda_graph_max_bs": g} for g in gbs_cands
    ] + [{"cuda_graph": False}]
    mems = _near_baseline(MEM_FRACTIONS, float(BASELINE["mem_fraction_static"]))  # type: ignore[arg-type]
    chunks = sorted(range(1024, 16385, 1024), key=lambda v: (abs(v - 8192), v))
    attn_cache: dict[tuple[bool, int], list[dict[str, object]]] = {}
    chunk_cache: dict[tuple[int, int, float, str], tuple[int, float] | None] = {}
    seen: set[tuple[object, ...]] = set()
    results: list[tuple[float, int, dict[str, object]]] = []
    evaluated = 0
    for ai, ar in enumerate(ar_front):
        for ri, (runner, ckpt) in enumerate(runners):
            for si, spec in enumerate(specs):
                draft = int(spec.get("speculative_num_steps", 0)) + 1  # type: ignore[call-overload]
                for gi, graph in enumerate(graphs):
                    key_g = (bool(graph["cuda_graph"]), draft)
                    if key_g not in attn_cache:
                        attn_cache[key_g] = _attention_options(key_g[0], draft, c)
                    for alloc in CATEGORIES["pytorch_alloc_conf"]:
                        for mem in mems:
                            lv = {
                                **BASELINE,
                                **ar,
                                **spec,
                                **graph,
                                "moe_runner_backend": runner,
                                "checkpoint": ckpt,
                                "mem_fraction_static": mem,
                                "pytorch_alloc_conf": alloc,
                            }
                            dec = config_from_levers(lv, mode="decode")
                            if pm.startup_failure(dec) is not None:
                                continue
                            ck = (ai, ri, mem, str(alloc))
                            if ck not in chunk_cache:
                                chunk_cache[ck] = _best_chunk(lv, chunks, input_len)
                            best_chunk = chunk_cache[ck]
                            if best_chunk is None:
                                continue
                            slots = pm.kv_slots(dec)
                            for mrr in mrr_cands:
                                limit = min(c, slots, mrr)
                                for ti, attn in enumerate(attn_cache[key_g]):
                                    key = (ai, ri, si, gi, ti, limit, round(best_chunk[1], 12))
                                    if key in seen:
                                        continue
                                    seen.add(key)
                                    cand = active_levers(
                                        {
                                            **lv,
                                            **attn,
                                            "max_running_requests": mrr,
                                            "chunked_prefill_size": best_chunk[0],
                                        }
                                    )
                                    thr = pm.expected_output_throughput(
                                        config_from_levers(cand),
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
    tpot = pm.expected_tpot_ms(
        config_from_levers(levers),
        concurrency=c,
        input_len=input_len,
        output_len=output_len,
        deployment=deployment,
    )
    return Optimum(levers=levers, throughput=thr, tpot_ms=tpot, evaluated=evaluated)


def _best_chunk(
    lv: dict[str, object], chunks: list[int], input_len: int
) -> tuple[int, float] | None:
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
