"""The kernel model: the MoE runners (how well each streams the expert weights and what its
expert compute costs, per checkpoint) and the sm_120 sparse-MLA attention kernels (flashinfer,
triton, torch), with their cost per layer in decode and per prefill forward.

Part of :mod:`autotune.sim.perf_model` (docs/performance-model.md §2, §4.1, §4.2, §5). The
runner tables are also what start-up checks a runner and checkpoint against
(:mod:`autotune.sim._perf_memory`), and the torch kernel's transient memory is part of the
non-static need there.
"""

from __future__ import annotations

from autotune.sim._perf_platform import (
    BYTES_PER_PARAM,
    DENSE_BYTES_PER_PARAM,
    EXPERT_PARAMS,
    HBM_BW,
    LAYERS,
    N_EXPERTS,
    NUM_SMS,
    SM120_DECODE_MAX_TOKENS,
    SPARSE_TOPK_TOKENS,
    TOP_K_EXPERTS,
)
from autotune.sim._perf_resolution import _resolve
from autotune.sim.args import SimConfig

# ----------------------------------------------------------------------------------------
# MoE runners: (fraction of HBM bandwidth reached streaming expert weights, seconds per
# token of expert compute over 43 layers on one GPU of four), per checkpoint it runs.
# ----------------------------------------------------------------------------------------
RUNNER_DECODE: dict[str, dict[str, tuple[float, float]]] = {
    # [calibrated] W4A16 dequantised on CUDA cores (§1): NVFP4 + flashinfer_cutlass = +24%
    "marlin": {"mxfp4": (0.30, 3.2e-3), "nvfp4": (0.30, 3.2e-3)},
    # [estimate] generic Triton fused MoE: ~half of Marlin's per-token cost, poor streaming
    "triton": {"mxfp4": (0.35, 1.6e-3), "nvfp4": (0.35, 1.6e-3)},
    "triton_kernel": {"mxfp4": (0.45, 0.8e-3), "nvfp4": (0.45, 0.8e-3)},
    # [estimate] tensor-core grouped GEMMs reach 60-80% of HBM bandwidth at decode sizes;
    # compute = 6.5 GFLOP/token/GPU (§7: 2 x 13B active / 4) at 160-330 TFLOPS effective FP4
    "cutlass": {"mxfp4": (0.60, 40e-6), "nvfp4": (0.68, 30e-6)},
    # [quantization/fp8.py] SM120: MXFP8 x MXFP4 cutlass_fused_moe; MXFP4 experts only
    "flashinfer_mxfp4": {"mxfp4": (0.74, 25e-6)},
    # [arg_groups/moe_hook.py] ModelOpt FP4 (NVFP4) only
    "flashinfer_cutlass": {"nvfp4": (0.80, 20e-6)},
    # [moe_hook.py] NVFP4 only; [estimate] CuTe DSL grouped GEMM a notch below cutlass here
    "flashinfer_cutedsl": {"nvfp4": (0.76, 22e-6)},
    # trtllm-gen kernels: accepted for NVFP4 but SM100-only (SM100_ONLY_RUNNERS below)
    "flashinfer_trtllm": {"nvfp4": (0.78, 20e-6)},
    "flashinfer_trtllm_routed": {"nvfp4": (0.78, 20e-6)},
}
# [arg_groups/overrides.py _moe_runner_backend_quant_constraints: "trtllm-gen MoE kernels
# are SM100-only"] these start, load the weights and fail on the first MoE forward on sm_120
SM100_ONLY_RUNNERS = ("flashinfer_trtllm", "flashinfer_trtllm_routed")
# Prefill is compute-bound [§7]: 6.5 GFLOP per token per GPU; [estimate] ~400 TFLOPS
# effective FP4 on tensor cores (datasheet ~2 PFLOPS dense FP4) -> ~16 us per token.
RUNNER_PREFILL_TOKEN_SECONDS: dict[str, float] = {
    "marlin": 108e-6,  # [estimate] ~60 TFLOPS FP16 on CUDA cores
    "triton": 80e-6,  # [estimate]
    "triton_kernel": 50e-6,  # [estimate]
    "cutlass": 22e-6,  # [estimate]
    "flashinfer_mxfp4": 18e-6,  # [estimate]
    "flashinfer_cutlass": 16e-6,  # [estimate]
    "flashinfer_cutedsl": 17e-6,  # [estimate]
    "flashinfer_trtllm": 16e-6,  # [estimate]
    "flashinfer_trtllm_routed": 16e-6,  # [estimate]
}


# ----------------------------------------------------------------------------------------
# Sparse-MLA attention on sm_120 (SGLANG_SM120_FLASHMLA_BACKEND, flash_mla_sm120.py)
# ----------------------------------------------------------------------------------------
KV_ENTRY_BYTES = 448 + 64 * 2 + 8  # [flash_mla_sm120.py] FP8 nope + BF16 rope + 8 scale bytes
SWA_PAGE_BYTES = 256 * KV_ENTRY_BYTES  # [same] one 256-token page
ATTN_LAYER_FIXED = 4e-6  # [estimate] launch + top-k index load per layer
# flashinfer: FlashInfer's CUTLASS SM120 sparse MLA decode (split-K) up to 64 query tokens,
# its paged kernel above; SGLang repacks the touched 256-token SWA pages into 64-token ones
# first (_split_kv_pages_to_64: "only ~2*batch pages are touched") unless
# SGLANG_OPT_SM120_DIRECT_SWA_KV stores them that way (mem_cache/deepseek_v4_memory_pool.py)
FI_DECODE_BW_SHARE = 0.50  # [estimate] gathered 584-byte entries at half of HBM bandwidth
FI_PAGED_BW_SHARE = 0.35  # [estimate] the paged kernel above 64 tokens (no split-K)
SPLIT_PAGES_PER_REQUEST = 2  # [flash_mla_sm120.py] touched SWA pages per request
SPLIT_FIXED = 2e-6  # [estimate] one page-split kernel per layer
# triton: the tiled Triton kernel (flash_mla_sm120_triton.py), grid (tokens, heads), every
# block walks all 512 top-k entries, no KV split. [calibrated] the seeds' profile: the
# kernel held 63% of decode time with 64 blocks on ~170 SMs (§1), i.e. ~18 ms per layer at
# the seeds' 12 running requests x 4 draft tokens.
ATTN_HEAD_GROUPS = 4  # [§1] blocks per request: 16 requests -> the seeds' 64 blocks
TRITON_ENTRY_SECONDS = 7.7e-6  # [calibrated] per top-k entry and draft token, one wave
TRITON_PREFILL_TOKEN_SECONDS = 8e-6  # [estimate] 43 layers, full occupancy (4x flashinfer)
# torch: the PyTorch reference path (_sm120_sparse_decode_fwd / _gather_and_dequant):
# ~30 unfused kernels per layer that materialise int64 byte offsets (512 x 448 x 8 B =
# 1.8 MB per query token), the dequantised BF16 and FP32 copies of the gathered KV and the
# scores: [estimate] ~10 MB of traffic and ~5 MB alive per query token per layer.
TORCH_KERNELS_PER_LAYER = 30  # [estimate]
TORCH_KERNEL_SECONDS = 3e-6  # [estimate] one small kernel on the GPU
TORCH_BYTES_PER_TOKEN = 10e6  # [estimate] traffic per query token per layer
TORCH_TRANSIENT_PER_TOKEN = 5e6  # [estimate] peak live memory per query token
TORCH_LAUNCH_SECONDS = 5e-6  # [estimate] one kernel launched from Python (eager)
PREFILL_ATTN_TOKEN_SECONDS = 2e-6  # [estimate] flashinfer: sparse attention + indexer per token


# ----------------------------------------------------------------------------------------
# Costs: distinct experts, MoE and dense weights, sparse-MLA attention
# ----------------------------------------------------------------------------------------
def distinct_experts(tokens: float) -> float:
    """U(T): expected distinct routed experts per layer touched by T tokens (§7)."""
    return N_EXPERTS * (1.0 - ((N_EXPERTS - TOP_K_EXPERTS) / N_EXPERTS) ** max(0.0, tokens))


def attention_backend(cfg: SimConfig) -> str:
    """The sm_120 sparse-MLA kernel (``SGLANG_SM120_FLASHMLA_BACKEND``); DeepSeek-V4 forces
    the dsv4 attention backend, so the Triton-attention split knobs never apply."""
    return _resolve(cfg).attn


def _attention_layer_seconds(cfg: SimConfig, batch: float, draft: int) -> float:
    """One layer of sparse-MLA decode for ``batch`` requests of ``draft`` query tokens."""
    r = _resolve(cfg)
    tokens = batch * draft
    if r.attn == "triton":
        waves = max(1.0, batch * ATTN_HEAD_GROUPS / NUM_SMS)
        return ATTN_LAYER_FIXED + TRITON_ENTRY_SECONDS * draft * SPARSE_TOPK_TOKENS * waves
    if r.attn == "torch":
        return (
            TORCH_KERNELS_PER_LAYER * TORCH_KERNEL_SECONDS + tokens * TORCH_BYTES_PER_TOKEN / HBM_BW
        )
    share = FI_DECODE_BW_SHARE if tokens <= SM120_DECODE_MAX_TOKENS else FI_PAGED_BW_SHARE
    t = ATTN_LAYER_FIXED + tokens * SPARSE_TOPK_TOKENS * KV_ENTRY_BYTES / (HBM_BW * share)
    if not cfg.sm120_direct_swa_kv:
        pages = batch * SPLIT_PAGES_PER_REQUEST
        t += SPLIT_FIXED + pages * SWA_PAGE_BYTES * 2 / HBM_BW  # read + write
    return t


def _moe_seconds(cfg: SimConfig, tokens: float, layers: int, dense_params: float) -> float:
    r = _resolve(cfg)
    bw_eff, tok_s = RUNNER_DECODE[r.runner][r.checkpoint]
    expert_bytes = layers * distinct_experts(tokens) * EXPERT_PARAMS * BYTES_PER_PARAM[r.checkpoint]
    weights = (expert_bytes + dense_params * DENSE_BYTES_PER_PARAM) / max(1, cfg.tp_size)
    return weights / (HBM_BW * bw_eff) + tokens * tok_s * layers / LAYERS


def _prefill_attention_seconds(cfg: SimConfig, tokens: int) -> float:
    """Sparse attention + indexer of one prefill forward, 43 layers (the same sm_120 kernel
    choice as decode: ``_use_sparse_prefill`` is off on sm_120, deepseek_v4_backend.py)."""
    r = _resolve(cfg)
    if r.attn == "torch":
        per_layer = (
            TORCH_KERNELS_PER_LAYER * (TORCH_KERNEL_SECONDS + TORCH_LAUNCH_SECONDS)
            + tokens * TORCH_BYTES_PER_TOKEN / HBM_BW
        )
        return LAYERS * per_layer
    per_token = TRITON_PREFILL_TOKEN_SECONDS if r.attn == "triton" else PREFILL_ATTN_TOKEN_SECONDS
    return tokens * per_token
