"""Decode step time: launch (eager, CUDA graph, breakable graph), scheduling (overlapped or
not), the padded graph batch, and MTP/EAGLE speculative decoding (draft passes, draft extend,
verification, acceptance), added to the MoE, attention and all-reduce costs of each step.

Part of :mod:`autotune.sim.perf_model` (docs/performance-model.md §4, §4.4, §4.5). The kernel
and all-reduce costs come from :mod:`autotune.sim._perf_kernels` and
:mod:`autotune.sim._perf_allreduce`; this module composes them into one step.
"""

from __future__ import annotations

import bisect
import math
from functools import lru_cache

from autotune.sim._perf_allreduce import allreduce_seconds
from autotune.sim._perf_kernels import (
    TORCH_KERNELS_PER_LAYER,
    TORCH_LAUNCH_SECONDS,
    _attention_layer_seconds,
    _moe_seconds,
)
from autotune.sim._perf_platform import (
    ALLREDUCES_PER_LAYER,
    DENSE_BYTES_PER_PARAM,
    DENSE_PARAMS,
    HBM_BW,
    HIDDEN,
    LAYERS,
    MTP_DENSE_PARAMS,
    VOCAB,
)
from autotune.sim._perf_resolution import _resolve
from autotune.sim.args import SimConfig

# ----------------------------------------------------------------------------------------
# Launch, scheduling, speculative decoding
# ----------------------------------------------------------------------------------------
EAGER_FORWARD_SECONDS = 30e-3  # [§7, estimate] 43 layers x ~25 kernels x ~25 us + Python
GRAPH_REPLAY_SECONDS = 0.3e-3  # [estimate] one CUDA-graph replay
# [model_executor/runner_backend/breakable_cuda_graph_backend.py] breakable graphs replay
# segments and run attention eagerly between them: [estimate] ~40 us per layer
BREAKABLE_LAYER_SECONDS = 40e-6
DRAFT_EAGER_SECONDS = 8e-3  # [estimate] one eager MTP draft pass (Python-heavy EAGLE loop)
DRAFT_GRAPH_SECONDS = 0.05e-3  # [estimate]
SCHED_FIXED_SECONDS = 1.0e-3  # [estimate] what the overlap scheduler cannot hide per step
SCHED_PER_REQUEST_SECONDS = 20e-6  # [estimate]
# [--disable-overlap-schedule; speculative_hook.py: "Non-overlap (synchronous) spec v2"]
# batch preparation and output processing then run between GPU steps: [estimate]
SYNC_SCHED_FIXED_SECONDS = 1.5e-3
SYNC_SCHED_PER_REQUEST_SECONDS = 40e-6
VERIFY_FIXED_SECONDS = 0.4e-3  # [estimate] EAGLE tree build + verify bookkeeping per step
VERIFY_PER_REQUEST_SECONDS = 10e-6  # [estimate]
ACCEPT_FIRST = 0.70  # [§7] MTP acceptance ~0.7 for the first draft token
ACCEPT_DECAY = 0.90  # [estimate] chained draft tokens are accepted a little less often
# [disaggregation/nixl/conn.py _prepare_payload_xfer: "If prefill does not run speculative
# decoding (the usual case), decode with speculative decoding will have more kv items";
# disaggregation/prefill.py hands decode the draft hidden states and top-k only when the
# prefill runs EAGLE] decode-only speculation drafts without the prompt's draft KV and seed
# state: [estimate] every draft token's acceptance x 0.85
UNSEEDED_ACCEPT_FACTOR = 0.85


# ----------------------------------------------------------------------------------------
# Speculative decoding: acceptance
# ----------------------------------------------------------------------------------------
def draft_seeded(cfg: SimConfig) -> bool:
    """Whether this server's drafts start from the prompt's draft KV and seed state: a null
    server prefills them itself; a decode server gets them only from a prefill server that
    runs EAGLE too (``expectation(..., prefill=)`` or the request's handoff says so)."""
    return cfg.disaggregation_mode == "null"


def accept_probabilities(cfg: SimConfig, *, seeded: bool | None = None) -> tuple[float, ...]:
    """Conditional acceptance of draft token k given tokens 1..k-1 were accepted.

    ``seeded``: the prefill ran the speculative algorithm too (default: :func:`draft_seeded`).
    """
    r = _resolve(cfg)
    if not r.spec:
        return ()
    full = draft_seeded(cfg) if seeded is None else seeded
    factor = 1.0 if full else UNSEEDED_ACCEPT_FACTOR
    return tuple(ACCEPT_FIRST * factor * ACCEPT_DECAY**k for k in range(r.steps))


def accept_length(cfg: SimConfig, *, seeded: bool | None = None) -> float:
    """Expected tokens per request per decode step (1 without speculative decoding)."""
    total, p = 1.0, 1.0
    for a in accept_probabilities(cfg, seeded=seeded):
        p *= a
        total += p
    return total


# ----------------------------------------------------------------------------------------
# Decode step
# ----------------------------------------------------------------------------------------
def uses_cuda_graph(cfg: SimConfig, batch: float) -> bool:
    """A decode step replays a graph when graphs are on and the batch fits the largest one."""
    r = _resolve(cfg)
    return r.graphs and batch <= r.graph_bs


def padded_batch(cfg: SimConfig, batch: float) -> float:
    """The captured batch size a graph replay runs (padding rows), or ``batch`` when eager.

    A fractional (mean) batch b runs floor(b) and ceil(b) requests in the proportion its
    fraction says, so the padded size is interpolated between theirs.
    """
    r = _resolve(cfg)
    if not uses_cuda_graph(cfg, batch):
        return batch
    sizes = r.graph_sizes

    def pad(n: int) -> int:
        return sizes[min(len(sizes) - 1, bisect.bisect_left(sizes, max(1, n)))]

    low = math.floor(batch + 1e-9)
    frac = batch - low
    if frac <= 1e-9:
        return float(pad(low))
    return (1.0 - frac) * pad(low) + frac * pad(low + 1)


def decode_step_breakdown(cfg: SimConfig, batch: float) -> dict[str, float]:
    """Seconds per decode step by component (for the docs and for tests)."""
    r = _resolve(cfg)
    b = max(1.0, float(batch))
    draft = r.tokens_per_request
    graph = uses_cuda_graph(cfg, b)
    p = padded_batch(cfg, b)  # padded rows go through the MoE and the all-reduces
    tokens = p * draft
    torch_eager = r.attn == "torch" and (not graph or r.graph_backend == "breakable")
    if not graph:
        launch = EAGER_FORWARD_SECONDS
    elif r.graph_backend == "breakable":
        launch = GRAPH_REPLAY_SECONDS + LAYERS * BREAKABLE_LAYER_SECONDS
    else:
        launch = GRAPH_REPLAY_SECONDS
    if torch_eager:  # the reference attention's kernels, launched from Python
        launch += LAYERS * TORCH_KERNELS_PER_LAYER * TORCH_LAUNCH_SECONDS
    sched = SCHED_FIXED_SECONDS + SCHED_PER_REQUEST_SECONDS * b
    if cfg.disable_overlap_schedule:
        sched += SYNC_SCHED_FIXED_SECONDS + SYNC_SCHED_PER_REQUEST_SECONDS * b
    out = {
        "moe_and_dense": _moe_seconds(cfg, tokens, LAYERS, DENSE_PARAMS),
        "attention": LAYERS * _attention_layer_seconds(cfg, b, draft),
        "allreduce": ALLREDUCES_PER_LAYER * LAYERS * allreduce_seconds(cfg, tokens * HIDDEN * 2),
        "launch": launch,
        "scheduler": sched,
        "draft": 0.0,
    }
    if r.spec:
        lm_head = VOCAB * HIDDEN * DENSE_BYTES_PER_PARAM / max(1, cfg.tp_size) / HBM_BW
        draft_launch = DRAFT_GRAPH_SECONDS if graph else DRAFT_EAGER_SECONDS
        if torch_eager:
            draft_launch += TORCH_KERNELS_PER_LAYER * TORCH_LAUNCH_SECONDS
        one = (
            _moe_seconds(cfg, p, 1, MTP_DENSE_PARAMS)
            + _attention_layer_seconds(cfg, b, 1)
            + ALLREDUCES_PER_LAYER * allreduce_seconds(cfg, p * HIDDEN * 2)
            + lm_head
            + draft_launch
        )
        # EAGLE re-runs the draft layer over the verified tokens ("draft extend")
        extend = (
            _moe_seconds(cfg, tokens, 1, MTP_DENSE_PARAMS)
            + _attention_layer_seconds(cfg, b, draft)
            + ALLREDUCES_PER_LAYER * allreduce_seconds(cfg, tokens * HIDDEN * 2)
            + draft_launch
        )
        out["draft"] = (
            r.steps * one + extend + VERIFY_FIXED_SECONDS + VERIFY_PER_REQUEST_SECONDS * b
        )
    return out


@lru_cache(maxsize=65536)
def _decode_step_cached(cfg: SimConfig, batch: float) -> float:
    return sum(decode_step_breakdown(cfg, batch).values()) * cfg.sim_time_scale


def decode_step_seconds(cfg: SimConfig, batch: float, *, noise: float = 1.0) -> float:
    """Duration of one decode step with ``batch`` running requests."""
    return _decode_step_cached(cfg, float(max(1.0, batch))) * noise
