"""Memory on one GPU and start-up: the weights, the static KV pool and the running cap it
allows, what the server needs outside the static pool (activations, CUDA graphs, draft
workspace, fragmentation), and the failure a real server would hit at start-up (argument
checks, not enough memory, CUDA OOM, SM100-only MoE kernels) with the lines it prints.

Part of :mod:`autotune.sim.perf_model` (docs/performance-model.md §2, §3). Start-up lives with
memory because most of its failures are this module's arithmetic (the static pool, the
non-static need).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.sim._perf_kernels import (
    RUNNER_DECODE,
    SM100_ONLY_RUNNERS,
    TORCH_TRANSIENT_PER_TOKEN,
)
from autotune.sim._perf_platform import (
    BYTES_PER_PARAM,
    DENSE_BYTES_PER_PARAM,
    DENSE_PARAMS,
    DSV4_KV_CACHE_DTYPES,
    DSV4_SPEC_ALGORITHMS,
    EXPERT_PARAMS,
    GPU_MEM_BYTES,
    LAYERS,
    MTP_DENSE_PARAMS,
    N_EXPERTS,
    SM120_FLASHMLA_BACKENDS,
)
from autotune.sim._perf_resolution import _path_checkpoint, _resolve
from autotune.sim.args import SimConfig

# ----------------------------------------------------------------------------------------
# Memory (per GPU)
# ----------------------------------------------------------------------------------------
# [calibrated] what one running request holds in the decode pools (FP8 compressed KV at the
# reserved context, indexer keys, request tables). No public figure: chosen so that the
# seeds' decode server at 0.88 holds 26 requests without MTP and 12 with it (§1: halved).
KV_SLOT_BYTES = 1.97e9
SPEC_SLOT_PER_DRAFT_TOKEN = 0.25  # [calibrated] EAGLE draft KV + verify buffers per draft token
NONSTATIC_BASE_BYTES = 2.0e9  # [estimate] CUDA context, NCCL/IPC buffers, workspaces
PREFILL_ACT_BYTES_PER_TOKEN = 0.2e6  # [estimate] peak activations per prefill-chunk token
# [calibrated] CUDA-graph pool per captured token (bs x draft) and MTP draft workspace per
# step: the seeds' 0.88 fits bs 8 with 3 steps; 0.95 with MTP is the OOM frontier
GRAPH_BYTES_PER_TOKEN = 10e6
DRAFT_WORKSPACE_BYTES_PER_STEP = 0.8e9
FRAGMENTATION = 1.30  # [estimate] caching-allocator overhead without expandable segments
FRAGMENTATION_EXPANDABLE = 1.08  # [estimate] PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
KV_SLOT_TOKENS = 8192  # [estimate] nominal tokens a KV slot holds (max_total_num_tokens / slots)


@dataclass(frozen=True)
class StartupFailure:
    """Why a server refuses or fails to start, with the lines a real one would print."""

    kind: str  # "cuda_oom" or "config_rejected" (the launcher's failure classes)
    lines: tuple[str, ...]
    exit_code: int = 1
    after_load: bool = True  # OOM shows up after weights load; argument checks before


# ----------------------------------------------------------------------------------------
# Start-up
# ----------------------------------------------------------------------------------------
def _weights_bytes_per_gpu(cfg: SimConfig, ckpt: str) -> float:
    experts = LAYERS * N_EXPERTS * EXPERT_PARAMS * BYTES_PER_PARAM[ckpt]
    return (experts + DENSE_PARAMS * DENSE_BYTES_PER_PARAM) / max(1, cfg.tp_size)


def _mtp_weights_bytes_per_gpu(cfg: SimConfig, ckpt: str) -> float:
    experts = N_EXPERTS * EXPERT_PARAMS * BYTES_PER_PARAM[ckpt]
    return (experts + MTP_DENSE_PARAMS * DENSE_BYTES_PER_PARAM) / max(1, cfg.tp_size)


def kv_pool_bytes(cfg: SimConfig) -> float:
    """Static memory left for KV after weights (and MTP draft weights) on one GPU."""
    r = _resolve(cfg)
    pool = r.mem * GPU_MEM_BYTES - _weights_bytes_per_gpu(cfg, r.checkpoint)
    if r.spec:
        pool -= _mtp_weights_bytes_per_gpu(cfg, r.checkpoint)
    return pool


def _slot_bytes(cfg: SimConfig) -> float:
    r = _resolve(cfg)
    spec_factor = 1.0 + SPEC_SLOT_PER_DRAFT_TOKEN * r.draft if r.spec else 1.0
    return KV_SLOT_BYTES * spec_factor


def kv_slots(cfg: SimConfig) -> int:
    """Running requests the KV pool can hold (before max_running_requests)."""
    return max(0, int(kv_pool_bytes(cfg) * cfg.sim_kv_scale // _slot_bytes(cfg)))


def running_cap(cfg: SimConfig) -> int:
    """Requests a decode step can serve at once: KV capacity capped by max_running_requests."""
    r = _resolve(cfg)
    slots = kv_slots(cfg)
    return slots if r.max_running is None else min(slots, r.max_running)


def kv_capacity_tokens(cfg: SimConfig) -> int:
    """Tokens the KV pool holds (``max_total_num_tokens``): the nominal slot size times the
    slots; the prefix cache's bound too (SGLang caches prefixes in the same pool)."""
    return kv_slots(cfg) * KV_SLOT_TOKENS


def nonstatic_need_bytes(cfg: SimConfig) -> float:
    """Memory outside the static pool the server needs, fragmentation included."""
    r = _resolve(cfg)
    need = NONSTATIC_BASE_BYTES
    mode = cfg.disaggregation_mode
    torch_attn = r.attn == "torch"
    if mode in ("prefill", "null"):
        need += r.chunk * PREFILL_ACT_BYTES_PER_TOKEN
        if torch_attn:  # the reference path materialises its gather for the whole chunk
            need += r.chunk * TORCH_TRANSIENT_PER_TOKEN
    if mode in ("decode", "null"):
        per_req = r.tokens_per_request
        if r.graphs:
            need += r.graph_bs * per_req * GRAPH_BYTES_PER_TOKEN
        if torch_attn:
            peak = r.graph_bs if r.graphs else running_cap(cfg)
            need += peak * per_req * TORCH_TRANSIENT_PER_TOKEN
        if r.spec:
            need += r.steps * DRAFT_WORKSPACE_BYTES_PER_STEP
    return need * (FRAGMENTATION_EXPANDABLE if r.expandable else FRAGMENTATION)


def _gib(x: float) -> str:
    return f"{x / 2**30:.2f} GiB"


def _rejected(*lines: str) -> StartupFailure:
    return StartupFailure(kind="config_rejected", lines=tuple(lines), after_load=False)


_RUNNER_QUANT_MESSAGES = {
    # [arg_groups/moe_hook.py handle_moe_kernel_config]
    "flashinfer_cutlass": "FlashInfer Cutlass MOE supports only: 'modelopt_fp4', "
    "'modelopt_fp8', 'modelopt_mixed', or bfloat16 (None).",
    "flashinfer_cutedsl": "FlashInfer CuteDSL MOE currently supports only: 'modelopt_fp4', "
    "'modelopt_mixed' (with NVFP4 MoE layers), 'nvfp4_online', or hybrid NVFP4 models.",
    "flashinfer_trtllm": "FlashInfer TRTLLM MOE supports only: 'modelopt_fp4', 'nvfp4_online', "
    "'fp8', 'modelopt_fp8', 'modelopt_mixed', 'compressed-tensors', or bfloat16 (None).",
    "flashinfer_trtllm_routed": "FlashInfer TRTLLM routed MOE supports only: 'fp8', 'mxfp8', "
    "'modelopt_fp4', 'modelopt_mixed', 'nvfp4_online', 'minimax_m3_nvfp4', or bfloat16 (None).",
}


def startup_failure(cfg: SimConfig) -> StartupFailure | None:
    """The failure a real server would hit at start-up for this configuration, if any."""
    r = _resolve(cfg)
    tb = "Traceback (most recent call last):"
    if r.chunk % r.page_size != 0:
        return _rejected(
            tb,
            '  File "sglang/srt/server_args.py", line 612, in __post_init__',
            f"AssertionError: chunked_prefill_size ({r.chunk}) must be divisible by "
            f"page_size ({r.page_size})",
        )
    if r.kv_cache_dtype not in DSV4_KV_CACHE_DTYPES:
        return _rejected(
            tb,
            '  File "sglang/srt/arg_groups/overrides.py", line 907, in _deepseek_v4_kv_cache_dtype',
            f"AssertionError: {r.kv_cache_dtype} is not supported for DeepseekV4ForCausalLM",
        )
    if cfg.quantization is not None and cfg.quantization != _path_checkpoint(cfg):
        return _rejected(
            tb,
            '  File "sglang/srt/configs/model_config.py", line 2132, in _verify_quantization',
            "ValueError: Quantization method specified in the model config "
            f"({_path_checkpoint(cfg)}) does not match the quantization method specified in "
            f"the `quantization` argument ({cfg.quantization}).",
        )
    if r.attn not in SM120_FLASHMLA_BACKENDS:
        return _rejected(
            tb,
            f"ValueError: SGLANG_SM120_FLASHMLA_BACKEND={r.attn!r}: expected flashinfer, "
            "triton or torch",
        )
    if r.runner not in RUNNER_DECODE:
        return _rejected(
            tb,
            '  File "sglang/srt/layers/moe/utils.py", line 118, in get_moe_runner_backend',
            f"ValueError: moe_runner_backend '{r.runner}' does not support this checkpoint "
            f"(quantization='{_path_checkpoint(cfg)}') on sm_120",
        )
    if r.checkpoint not in RUNNER_DECODE[r.runner]:
        quant = "modelopt_fp4" if r.checkpoint == "nvfp4" else "mxfp4"
        if r.runner in _RUNNER_QUANT_MESSAGES:
            return _rejected(
                tb,
                '  File "sglang/srt/arg_groups/moe_hook.py", line 81, in handle_moe_kernel_config',
                f"AssertionError: Invalid quantization '{quant}'. ",
                _RUNNER_QUANT_MESSAGES[r.runner],
            )
        return _rejected(
            tb,
            '  File "sglang/srt/layers/quantization/fp8.py", line 459, in get_quant_method',
            "ValueError: moe_runner_backend 'flashinfer_mxfp4' only supports MXFP4 "
            f"checkpoints (--quantization mxfp4); got quantization='{quant}'",
        )
    algo = r.spec_algorithm
    if algo is not None and algo not in DSV4_SPEC_ALGORITHMS:
        return _rejected(
            tb,
            '  File "sglang/srt/arg_groups/deepseek_v4_hook.py", line 152, in '
            "apply_deepseek_v4_defaults",
            "AssertionError: Only EAGLE and DSPARK speculative algorithms are supported for "
            "DeepseekV4ForCausalLM",
        )
    if algo == "DSPARK":
        return _rejected(
            tb,
            "ValueError: DSPARK needs a DSpark draft model (--speculative-draft-model-path); "
            "this checkpoint ships only the MTP layer",
        )
    if (
        r.spec
        and cfg.speculative_num_steps is None
        and (cfg.speculative_eagle_topk is not None or cfg.speculative_num_draft_tokens is not None)
    ):
        return _rejected(
            tb,
            '  File "sglang/srt/arg_groups/speculative_hook.py", line 1160, in '
            "_handle_eagle_family",
            "AssertionError",
        )
    if r.spec and r.topk != 1:
        return _rejected(
            tb,
            '  File "sglang/srt/arg_groups/deepseek_v4_hook.py", line 156, in '
            "apply_deepseek_v4_defaults",
            "AssertionError: Only EAGLE speculative algorithm with topk == 1 is supported for "
            "DeepseekV4ForCausalLM",
        )
    if r.spec and not 1 <= r.steps <= 16:
        return _rejected(
            tb,
            f"ValueError: speculative_num_steps must be in [1, 16], got {r.steps}",
        )
    if cfg.disaggregation_mode != "prefill" and r.max_running is not None and r.max_running < 1:
        return _rejected(tb, "ValueError: max_running_requests must be >= 1")
    # --- after the weights are loaded ---
    if r.kv_cache_dtype == "bfloat16":
        return StartupFailure(
            kind="config_rejected",
            lines=(
                tb,
                '  File "sglang/srt/mem_cache/deepseek_v4_memory_pool.py", line 321, in '
                "create_buffer",
                "    assert self.store_dtype == torch.uint8",
                "AssertionError",
            ),
        )
    if not 0.0 < r.mem < 1.0 or kv_slots(cfg) < 1:
        static = r.mem * GPU_MEM_BYTES
        return StartupFailure(
            kind="config_rejected",
            lines=(
                tb,
                '  File "sglang/srt/model_executor/model_runner.py", line 1420, in '
                "init_memory_pool",
                "RuntimeError: Not enough memory. Please try to increase "
                f"--mem-fraction-static. (static pool {_gib(static)}, weights "
                f"{_gib(_weights_bytes_per_gpu(cfg, r.checkpoint))})",
            ),
        )
    available = (1.0 - r.mem) * GPU_MEM_BYTES
    need = nonstatic_need_bytes(cfg)
    if need > available:
        return _oom_failure(cfg, need=need, available=available)
    if r.runner in SM100_ONLY_RUNNERS:
        return StartupFailure(
            kind="config_rejected",
            lines=(
                "Scheduler hit an exception: Traceback (most recent call last):",
                '  File "sglang/srt/layers/moe/moe_runner/flashinfer_trtllm.py", in fused_experts',
                f"RuntimeError: moe_runner_backend '{r.runner}': trtllm-gen MoE kernels are "
                "SM100-only; this GPU is sm_120 (use flashinfer_cutlass for modelopt_fp4)",
                "Received sigquit from a child process. It usually means the child failed.",
            ),
        )
    return None


def _oom_failure(cfg: SimConfig, *, need: float, available: float) -> StartupFailure:
    r = _resolve(cfg)
    short = need - available
    tried = max(20 * 2**20, math.ceil(short / (2 * 2**20)) * 2 * 2**20 + 20 * 2**20)
    free = max(0.0, available - tried * 0.5)
    in_use = GPU_MEM_BYTES - free
    reserved_unalloc = 0.0 if r.expandable else need * 0.12
    oom = (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {_gib(tried)}. "
        f"GPU 0 has a total capacity of {_gib(GPU_MEM_BYTES)} of which "
        f"{free / 2**20:.2f} MiB is free. Including non-PyTorch memory, this process has "
        f"{_gib(in_use)} memory in use. Of the allocated memory "
        f"{_gib(in_use - reserved_unalloc - 0.6 * 2**30)} is allocated by PyTorch, and "
        f"{_gib(reserved_unalloc)} is reserved by PyTorch but unallocated. If reserved but "
        "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:"
        "True to avoid fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )
    decode_side = cfg.disaggregation_mode in ("decode", "null")
    lines: tuple[str, ...]
    if decode_side and r.graphs:
        lines = (
            f"Capture cuda graph begin. This can take up to several minutes. "
            f"avail mem={_gib(available)}",
            "Scheduler hit an exception: Traceback (most recent call last):",
            '  File "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py", in capture',
            "    self.capture()",
            oom,
            "",
            "During handling of the above exception, another exception occurred:",
            "",
            "Exception: Capture cuda graph failed: CUDA out of memory. "
            f"Tried to allocate {_gib(tried)}.",
            "Possible solutions:",
            "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
            "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)",
            "3. disable torch compile by not using --enable-torch-compile",
            "4. disable CUDA graph by --cuda-graph-backend-decode disabled. (Not recommended. "
            "Huge performance loss)",
            "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose ",
            "Received sigquit from a child process. It usually means the child failed.",
        )
    else:
        lines = (
            "Scheduler hit an exception: Traceback (most recent call last):",
            '  File "sglang/srt/managers/scheduler.py", line 2905, in run_scheduler_process',
            "    scheduler.event_loop_normal()",
            '  File "torch/nn/modules/module.py", line 1773, in _wrapped_call_impl',
            oom,
            "Received sigquit from a child process. It usually means the child failed.",
        )
    return StartupFailure(kind="cuda_oom", lines=lines)
