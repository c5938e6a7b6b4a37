"""Prefill time: one forward over at most a chunk, chunking by ``chunked_prefill_size``, the
EAGLE draft work a speculative prefill server adds, and the prefix (radix) cache that lets a
prefill skip a cached prompt prefix.

Part of :mod:`autotune.sim.perf_model` (docs/performance-model.md §5). It reuses the kernel
and all-reduce costs of the decode side (:mod:`autotune.sim._perf_kernels`,
:mod:`autotune.sim._perf_allreduce`).
"""

from __future__ import annotations

from autotune.sim._perf_allreduce import allreduce_seconds
from autotune.sim._perf_decode import DRAFT_EAGER_SECONDS
from autotune.sim._perf_kernels import (
    RUNNER_DECODE,
    RUNNER_PREFILL_TOKEN_SECONDS,
    _prefill_attention_seconds,
    distinct_experts,
)
from autotune.sim._perf_platform import (
    ALLREDUCES_PER_LAYER,
    BYTES_PER_PARAM,
    DENSE_BYTES_PER_PARAM,
    DENSE_PARAMS,
    EXPERT_PARAMS,
    HBM_BW,
    HIDDEN,
    LAYERS,
    MTP_DENSE_PARAMS,
    VOCAB,
)
from autotune.sim._perf_resolution import _resolve
from autotune.sim.args import SimConfig

# ----------------------------------------------------------------------------------------
# Prefill
# ----------------------------------------------------------------------------------------
PREFILL_FORWARD_SECONDS = 15e-3  # [estimate] prefill runs eager: launches + Python


def prefill_forward_seconds(cfg: SimConfig, tokens: int) -> float:
    """One prefill forward pass over ``tokens`` tokens (at most one chunk)."""
    r = _resolve(cfg)
    if tokens <= 0:
        return 0.0
    bw_eff, _ = RUNNER_DECODE[r.runner][r.checkpoint]
    expert_bytes = LAYERS * distinct_experts(tokens) * EXPERT_PARAMS * BYTES_PER_PARAM[r.checkpoint]
    weights = (expert_bytes + DENSE_PARAMS * DENSE_BYTES_PER_PARAM) / max(1, cfg.tp_size)
    return cfg.sim_time_scale * (
        PREFILL_FORWARD_SECONDS
        + weights / (HBM_BW * bw_eff)
        + tokens * RUNNER_PREFILL_TOKEN_SECONDS[r.runner]
        + _prefill_attention_seconds(cfg, tokens)
        + ALLREDUCES_PER_LAYER * LAYERS * allreduce_seconds(cfg, tokens * HIDDEN * 2)
    )


def prefill_draft_seconds(cfg: SimConfig, tokens: int) -> float:
    """The EAGLE work a speculative prefill server adds per request (disaggregation/
    prefill.py): the MTP layer over the prompt and one draft step, eager."""
    r = _resolve(cfg)
    if not r.spec or tokens <= 0:
        return 0.0
    bw_eff, _ = RUNNER_DECODE[r.runner][r.checkpoint]
    experts = distinct_experts(tokens) * EXPERT_PARAMS * BYTES_PER_PARAM[r.checkpoint]
    weights = (experts + MTP_DENSE_PARAMS * DENSE_BYTES_PER_PARAM) / max(1, cfg.tp_size)
    lm_head = VOCAB * HIDDEN * DENSE_BYTES_PER_PARAM / max(1, cfg.tp_size) / HBM_BW
    return cfg.sim_time_scale * (
        weights / (HBM_BW * bw_eff)
        + tokens * RUNNER_PREFILL_TOKEN_SECONDS[r.runner] / LAYERS
        + _prefill_attention_seconds(cfg, tokens) / LAYERS
        + ALLREDUCES_PER_LAYER * allreduce_seconds(cfg, tokens * HIDDEN * 2)
        + lm_head
        + DRAFT_EAGER_SECONDS
    )


def prefill_seconds(cfg: SimConfig, tokens: int, *, noise: float = 1.0) -> float:
    """Prefill of ``tokens`` tokens, chunked by ``chunked_prefill_size`` (plus the draft
    extend of a speculative prefill server)."""
    chunk = max(1, _resolve(cfg).chunk)
    total, left = 0.0, int(tokens)
    while left > 0:
        total += prefill_forward_seconds(cfg, min(chunk, left))
        left -= chunk
    if cfg.disaggregation_mode == "prefill":
        total += prefill_draft_seconds(cfg, int(tokens))
    return total * noise


# ----------------------------------------------------------------------------------------
# Prefix (radix) cache
# ----------------------------------------------------------------------------------------
# [mem_cache/radix_cache.py] with page_size > 1 a prefix matches in whole pages
# (RadixKey.page_aligned), and DeepSeek-V4's page is 256 tokens; [managers/schedule_batch.py
# Req._compute_max_prefix_len] the match stops one token short of the prompt, whose last
# token is always computed (it gives the first output token's logits). A cached token costs
# nothing in the forward [estimate]: the model has no context-length term (sparse MLA reads
# 512 top-k entries whatever the prefix), so the indexer's scan of the prefix is left out.
def radix_cache_enabled(cfg: SimConfig) -> bool:
    """The radix cache is on: not ``--disable-radix-cache``, no speculative decoding, not a
    PD decode server (``disable_radix_cache`` as resolved)."""
    return not _resolve(cfg).radix_disabled


def prefix_cache_page(cfg: SimConfig) -> int:
    """The prefix cache's granularity in tokens: the KV page size (256 for DeepSeek-V4)."""
    return _resolve(cfg).page_size


def cached_prefix_tokens(cfg: SimConfig, prompt_len: int, shared_len: int) -> int:
    """Tokens of a ``prompt_len``-token prompt a prefill skips when its first ``shared_len``
    tokens are cached: whole pages, at most ``prompt_len - 1``; 0 without the radix cache."""
    if not radix_cache_enabled(cfg) or prompt_len <= 1 or shared_len <= 0:
        return 0
    page = max(1, prefix_cache_page(cfg))
    return min(int(shared_len), int(prompt_len) - 1) // page * page


def prompt_prefill_seconds(
    cfg: SimConfig, prompt_len: int, *, shared_prefix: int = 0, noise: float = 1.0
) -> float:
    """Prefill of a ``prompt_len``-token prompt whose first ``shared_prefix`` tokens are in
    the radix cache: only the uncached suffix is computed (and chunked)."""
    uncached = int(prompt_len) - cached_prefix_tokens(cfg, prompt_len, shared_prefix)
    return prefill_seconds(cfg, uncached, noise=noise)
