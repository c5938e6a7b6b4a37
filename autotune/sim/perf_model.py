"""Performance model of DeepSeek-V4-Flash on 8x RTX PRO 6000 Blackwell (PCIe), PD-disaggregated.

Pure functions of a :class:`~autotune.sim.args.SimConfig`: no I/O, no clock, no randomness
except through explicit ``noise`` arguments. ``docs/performance-model.md`` writes every
formula down with its constants and their sources; section numbers (§) refer to
``DOMAIN.md``. Constants marked "calibrated" have no public measurement behind them and are
set so that the seeds' deployment reproduces what was measured there (25 tok/s and TPOT
~500 ms at C=16, +24% for NVFP4 on tensor cores, the MTP verifier halving the batch).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from autotune.sim.args import SimConfig

if TYPE_CHECKING:
    from autotune.sim.optimum import Optimum

# Source tags: [§n] DOMAIN.md section; [datasheet] NVIDIA RTX PRO 6000 Blackwell datasheet;
# [SGLang] SGLang source/benchmarks; [calibrated] set so the seeds' measurements come out
# (25 tok/s, TPOT ~500 ms, +24% NVFP4, halved batch; §1); [estimate] an engineering
# estimate of the right magnitude with no public measurement behind it.
# ----------------------------------------------------------------------------------------
# Hardware
# ----------------------------------------------------------------------------------------
GPU_MEM_BYTES = 94.97 * 2**30  # [datasheet] 96 GB GDDR7; torch reports 94.97 GiB capacity
HBM_BW = 1.792e12  # [datasheet, §7] bytes/s, 512-bit GDDR7
NUM_SMS = 188  # [datasheet, §2]
PCIE_ALGBW_MAX = 17e9  # [§7] ~25 GB/s PCIe 5.0 x16 in practice / ring factor 2*(4-1)/4

# ----------------------------------------------------------------------------------------
# Model: DeepSeek-V4-Flash
# ----------------------------------------------------------------------------------------
LAYERS = 43  # [§1]
HIDDEN = 4096  # [§1]
N_EXPERTS = 256  # [§1] routed experts
TOP_K_EXPERTS = 6  # [§1] top-6 routing; U(T) uses 250/256 = 1 - 6/256 [§7]
EXPERT_PARAMS = 3 * 4096 * 2048  # [§7] 25.2M params per expert
DENSE_PARAMS = 7e9  # [§7] FP8 dense weights
DENSE_BYTES_PER_PARAM = 1.0  # [§1] FP8
BYTES_PER_PARAM = {"mxfp4": 0.53, "nvfp4": 0.5625}  # [§7] E2M1 + E8M0/32; E2M1 + FP8/16
MTP_DENSE_PARAMS = DENSE_PARAMS / LAYERS  # [§1] one next-n layer ~ one layer's dense part
SPARSE_TOPK_TOKENS = 512  # [§2] sparse MLA attends to the 512 top-k tokens
ALLREDUCES_PER_LAYER = 2  # [§7] 86 all-reduces per step
VOCAB = 129280  # [estimate] DeepSeek vocabulary size (MTP draft LM head read)

# ----------------------------------------------------------------------------------------
# SGLang behaviour
# ----------------------------------------------------------------------------------------
DSV4_PAGE_SIZE = 256  # [§2] DeepSeek-V4 forces page size 256 ...
DSV4_ATTENTION_BACKEND = "dsv4"  # [§2] ... and attention backend dsv4
SPEC_DEFAULT_MAX_RUNNING = 48  # [§2] speculative decoding sets max_running_requests 48
DSV4_DEFAULT_SPEC = (3, 1, 4)  # [SGLang] auto steps/topk/draft for DeepSeek MTP (seeds ran 3/1/4)
DEFAULT_CHUNKED_PREFILL = 8192  # [SGLang] default on > 80 GB GPUs (the seeds ran it)
DEFAULT_MEM_FRACTION = 0.88  # [estimate] SGLang's derived default here (the seeds ran 0.88)
DEFAULT_CUDA_GRAPH_MAX_BS = 160  # [estimate] SGLang's large-GPU default
DEFAULT_CUDA_GRAPH_MAX_BS_SPEC = 64  # [estimate] smaller default with speculative decoding
NCCL_DEFAULT_CHANNELS = 2  # [estimate] NCCL's ring channel count for 4 GPUs on PCIe
NCCL_LL_MAX_BYTES = 64 * 1024  # [estimate] NCCL's tuner switches LL -> Simple here on PCIe
IPC_ALLREDUCE_WORLD = (2, 4, 8)  # [§2] PCIe IPC all-reduce supports world 2/4/8
SGLANG_VERSION = "0.5.6.post2-sim"

# ----------------------------------------------------------------------------------------
# MoE runners: (fraction of HBM bandwidth reached streaming expert weights, seconds per
# token of expert compute over 43 layers on one GPU of four), per checkpoint.
# ----------------------------------------------------------------------------------------
RUNNER_DECODE: dict[str, dict[str, tuple[float, float]]] = {
    # [calibrated] W4A16 dequantised on CUDA cores (§1): NVFP4 + flashinfer_cutlass = +24%
    "marlin": {"mxfp4": (0.30, 3.8e-3), "nvfp4": (0.30, 3.8e-3)},
    # [estimate] generic Triton fused MoE: ~half of Marlin's per-token cost, poor streaming
    "triton": {"mxfp4": (0.35, 1.6e-3), "nvfp4": (0.35, 1.6e-3)},
    "triton_kernel": {"mxfp4": (0.45, 0.8e-3), "nvfp4": (0.45, 0.8e-3)},
    # [estimate] tensor-core grouped GEMMs reach 60-80% of HBM bandwidth at decode sizes;
    # compute = 6.5 GFLOP/token/GPU (§7: 2 x 13B active / 4) at 160-330 TFLOPS effective FP4
    "cutlass": {"mxfp4": (0.60, 40e-6), "nvfp4": (0.68, 30e-6)},
    "flashinfer_mxfp4": {"mxfp4": (0.74, 25e-6)},
    "flashinfer_cutlass": {"nvfp4": (0.80, 20e-6)},
    "flashinfer_trtllm": {"nvfp4": (0.78, 20e-6)},
    "flashinfer_trtllm_routed": {"nvfp4": (0.78, 20e-6)},
}
# Prefill is compute-bound [§7]: 6.5 GFLOP per token per GPU; [estimate] ~400 TFLOPS
# effective FP4 on tensor cores (datasheet ~2 PFLOPS dense FP4) -> ~16 us per token.
RUNNER_PREFILL_TOKEN_SECONDS: dict[str, float] = {
    "marlin": 108e-6,  # [estimate] ~60 TFLOPS FP16 on CUDA cores
    "triton": 80e-6,  # [estimate]
    "triton_kernel": 50e-6,  # [estimate]
    "cutlass": 22e-6,  # [estimate]
    "flashinfer_mxfp4": 18e-6,  # [estimate]
    "flashinfer_cutlass": 16e-6,  # [estimate]
    "flashinfer_trtllm": 16e-6,  # [estimate]
    "flashinfer_trtllm_routed": 16e-6,  # [estimate]
}

# ----------------------------------------------------------------------------------------
# Sparse-MLA decode attention (Triton on sm_120)
# ----------------------------------------------------------------------------------------
ATTN_HEAD_GROUPS = 4  # [§1] blocks per request per split: 16 requests -> the seeds' 64 blocks
ATTN_LAYER_FIXED = 4e-6  # [estimate] launch + top-k index load per layer
KV_ENTRY_SECONDS = 0.18e-6  # [estimate] per gathered 576-byte KV entry per block
SPLIT_REDUCE_FIXED = 2e-6  # [estimate] flash-decoding combine kernel launch
SPLIT_REDUCE_PER_PARTIAL = 4e-9  # [estimate] per (request, draft token, head, split) partial
# [calibrated] graph capture without static splits runs the generic one-split fallback
# kernel at 50x the per-entry cost: the seeds' kernel holding most of decode time (§1)
FALLBACK_ENTRY_SECONDS = 50 * KV_ENTRY_SECONDS

# ----------------------------------------------------------------------------------------
# All-reduce over PCIe: base latency + bytes / algbw (NCCL default 2 channels, Ring)
# ----------------------------------------------------------------------------------------
NCCL_PROTOCOLS: dict[str, tuple[float, float, float]] = {
    # name: (base latency s, algbw bytes/s at 2 channels, usable share of link bandwidth)
    "Simple": (55e-6, 12e9, 1.0),  # [estimate] latency-bound at 128 KB: ~66 us (§7)
    "LL": (15e-6, 5e9, 0.5),  # [§7, estimate] between Simple and custom; flags halve bw
    "LL128": (2e-6, 16e9, 0.94),  # [§4, estimate] fastest of all, unsafe without NVLink
}
NCCL_TREE_FACTORS = (0.8, 0.6)  # [estimate] base, bw: fewer hops, half-duplex chain on PCIe
NCCL_PER_CHANNEL_SECONDS = 0.5e-6  # [estimate] sync latency per channel above the default
NCCL_CONTENTION_CHANNELS = 8  # [estimate] above this, channels contend for the same links
# [SGLang pcie_ipc_ar.py, §7] one-shot IPC all-reduce: 4-10x faster than NCCL at these sizes
IPC_ALLREDUCE = (6e-6, 12e9)

# ----------------------------------------------------------------------------------------
# Launch, scheduling, speculative decoding
# ----------------------------------------------------------------------------------------
EAGER_FORWARD_SECONDS = 30e-3  # [§7, estimate] 43 layers x ~25 kernels x ~25 us + Python
GRAPH_REPLAY_SECONDS = 0.3e-3  # [estimate] one CUDA-graph replay
DRAFT_EAGER_SECONDS = 8e-3  # [estimate] one eager MTP draft pass (Python-heavy EAGLE loop)
DRAFT_GRAPH_SECONDS = 0.05e-3  # [estimate]
SCHED_FIXED_SECONDS = 1.0e-3  # [estimate] scheduler + sampling + output processing per step
SCHED_PER_REQUEST_SECONDS = 20e-6  # [estimate]
VERIFY_FIXED_SECONDS = 0.4e-3  # [estimate] EAGLE tree build + verify bookkeeping per step
VERIFY_PER_REQUEST_SECONDS = 10e-6  # [estimate]
ACCEPT_FIRST = 0.70  # [§7] MTP acceptance ~0.7 for the first draft token
ACCEPT_DECAY = 0.90  # [estimate] chained draft tokens are accepted a little less often
PREFILL_FORWARD_SECONDS = 15e-3  # [estimate] prefill runs eager: launches + Python
PREFILL_ATTN_TOKEN_SECONDS = 2e-6  # [estimate] sparse attention + indexer per token
ROUTER_OVERHEAD_SECONDS = 1.5e-3  # [estimate] two extra HTTP hops through the PD router
CLIENT_OVERHEAD_SECONDS = 0.5e-3  # [estimate] one HTTP request/response
# [calibrated against the simulator's own PD closed loop] FIFO prefill queue, Kingman's
# G/D/1: closed-loop arrivals are more regular than Poisson (squared CV 0.6)
PREFILL_ARRIVAL_SCV = 0.6
PREFILL_MAX_UTILISATION = 0.98

# ----------------------------------------------------------------------------------------
# Memory (per GPU)
# ----------------------------------------------------------------------------------------
# [calibrated] what one running request holds in the decode pools (compressed KV at the
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


@dataclass(frozen=True)
class StartupFailure:
    """Why a server refuses or fails to start, with the lines a real one would print."""

    kind: str  # "cuda_oom" or "config_rejected" (the launcher's failure classes)
    lines: tuple[str, ...]
    exit_code: int = 1
    after_load: bool = True  # OOM shows up after weights load; argument checks before


# ----------------------------------------------------------------------------------------
# Resolution: what SGLang does to the arguments
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Resolved:
    checkpoint: str  # mxfp4 | nvfp4
    runner: str
    mem: float
    spec: bool
    spec_algorithm: str | None
    steps: int
    topk: int
    draft: int
    max_running: int | None
    graphs: bool
    graph_bs: int
    chunk: int
    page_size: int
    custom_ar_disabled: bool
    radix_disabled: bool
    expandable: bool


def checkpoint_of(cfg: SimConfig) -> str:
    """``nvfp4`` for a ModelOpt FP4 checkpoint, else the original ``mxfp4``."""
    if cfg.quantization == "modelopt_fp4":
        return "nvfp4"
    if cfg.quantization == "mxfp4":
        return "mxfp4"
    return "nvfp4" if "NVFP4" in cfg.model_path.upper() else "mxfp4"


def _path_checkpoint(cfg: SimConfig) -> str:
    return "modelopt_fp4" if "NVFP4" in cfg.model_path.upper() else "mxfp4"


def _expandable(cfg: SimConfig) -> bool:
    conf = (cfg.pytorch_cuda_alloc_conf or "").replace(" ", "")
    return "expandable_segments:True" in conf


@lru_cache(maxsize=4096)
def _resolve(cfg: SimConfig) -> _Resolved:
    ckpt = checkpoint_of(cfg)
    runner = cfg.moe_runner_backend
    if runner == "auto":  # §2: newest builds on sm_120
        runner = "flashinfer_mxfp4" if ckpt == "mxfp4" else "flashinfer_trtllm_routed"
    algo = cfg.speculative_algorithm
    spec = algo in ("EAGLE", "EAGLE3", "NEXTN")
    steps = topk = draft = 0
    if spec:
        if algo == "NEXTN":
            algo = "EAGLE"
        if cfg.speculative_num_steps is None:
            steps, topk, draft = DSV4_DEFAULT_SPEC
        else:
            steps = cfg.speculative_num_steps
            topk = cfg.speculative_eagle_topk if cfg.speculative_eagle_topk is not None else 1
            draft = steps + 1 if topk == 1 else (cfg.speculative_num_draft_tokens or steps + 1)
    max_running = cfg.max_running_requests
    if max_running is None and spec:
        max_running = SPEC_DEFAULT_MAX_RUNNING
    graph_bs = cfg.cuda_graph_max_bs_decode or cfg.cuda_graph_max_bs
    if graph_bs is None:
        graph_bs = DEFAULT_CUDA_GRAPH_MAX_BS_SPEC if spec else DEFAULT_CUDA_GRAPH_MAX_BS
    return _Resolved(
        checkpoint=ckpt,
        runner=runner,
        mem=cfg.mem_fraction_static
        if cfg.mem_fraction_static is not None
        else DEFAULT_MEM_FRACTION,
        spec=spec,
        spec_algorithm=algo if spec else cfg.speculative_algorithm,
        steps=steps,
        topk=topk,
        draft=draft,
        max_running=max_running,
        graphs=not cfg.disable_cuda_graph,
        graph_bs=graph_bs,
        chunk=cfg.chunked_prefill_size
        if cfg.chunked_prefill_size is not None
        else DEFAULT_CHUNKED_PREFILL,
        page_size=DSV4_PAGE_SIZE,
        # custom all-reduce needs full NVLink for more than 2 PCIe GPUs (§2)
        custom_ar_disabled=cfg.disable_custom_all_reduce or cfg.tp_size > 2,
        radix_disabled=cfg.disable_radix_cache or spec,  # §2: incompatible with spec decode
        expandable=_expandable(cfg),
    )


def allreduce_path(cfg: SimConfig) -> str:
    """``none`` (TP1), ``pcie_ipc``, ``custom`` (TP2 custom all-reduce) or ``nccl``."""
    if cfg.tp_size <= 1:
        return "none"
    if cfg.pcie_ipc_allreduce and cfg.tp_size in IPC_ALLREDUCE_WORLD:
        return "pcie_ipc"
    if not _resolve(cfg).custom_ar_disabled:
        return "custom"
    return "nccl"


def resolve(cfg: SimConfig) -> dict[str, object]:
    """The resolved server arguments as SGLang's ``/server_info`` shows them."""
    r = _resolve(cfg)
    info: dict[str, object] = {
        "model_path": cfg.model_path,
        "tokenizer_path": cfg.model_path,
        "served_model_name": cfg.served_model_name or cfg.model_path,
        "tp_size": cfg.tp_size,
        "host": cfg.host,
        "port": cfg.port,
        "disaggregation_mode": cfg.disaggregation_mode,
        "disaggregation_bootstrap_port": cfg.disaggregation_bootstrap_port,
        "disaggregation_transfer_backend": cfg.disaggregation_transfer_backend,
        "moe_runner_backend": r.runner,
        "quantization": cfg.quantization or _path_checkpoint(cfg),
        "mem_fraction_static": r.mem,
        "disable_custom_all_reduce": r.custom_ar_disabled,
        "cuda_graph_max_bs": r.graph_bs,
        "cuda_graph_max_bs_decode": r.graph_bs,
        "disable_cuda_graph": not r.graphs,
        "max_running_requests": running_cap(cfg)
        if cfg.disaggregation_mode != "prefill"
        else r.max_running,
        "chunked_prefill_size": r.chunk,
        "page_size": r.page_size,
        "attention_backend": DSV4_ATTENTION_BACKEND,
        "speculative_algorithm": r.spec_algorithm,
        "speculative_num_steps": r.steps if r.spec else cfg.speculative_num_steps,
        "speculative_eagle_topk": r.topk if r.spec else cfg.speculative_eagle_topk,
        "speculative_num_draft_tokens": r.draft if r.spec else cfg.speculative_num_draft_tokens,
        "triton_attention_num_kv_splits": cfg.triton_attention_num_kv_splits,
        "enable_metrics": cfg.enable_metrics,
        "disable_radix_cache": r.radix_disabled,
        "enable_mixed_chunk": False,  # §2: speculative decoding disables mixed chunk
        "trust_remote_code": cfg.trust_remote_code,
        "base_gpu_id": cfg.base_gpu_id,
        "log_level": cfg.log_level,
        "context_length": cfg.context_length or 1048576,
        "random_seed": cfg.random_seed if cfg.random_seed is not None else 0,
    }
    return info


def silent_rewrites(cfg: SimConfig) -> list[str]:
    """Human-readable list of settings the server changed without being asked."""
    r = _resolve(cfg)
    out: list[str] = []
    if not cfg.disable_custom_all_reduce and r.custom_ar_disabled:
        out.append(
            "disable_custom_all_reduce: False -> True (custom all-reduce needs NVLink for "
            f"TP{cfg.tp_size} over PCIe)"
        )
    if cfg.speculative_algorithm == "NEXTN":
        out.append("speculative_algorithm: NEXTN -> EAGLE")
    if r.spec and cfg.max_running_requests is None:
        out.append(f"max_running_requests: None -> {SPEC_DEFAULT_MAX_RUNNING} (speculative)")
    if (
        r.spec
        and cfg.speculative_num_draft_tokens is not None
        and cfg.speculative_num_draft_tokens != r.draft
    ):
        out.append(
            f"speculative_num_draft_tokens: {cfg.speculative_num_draft_tokens} -> {r.draft} "
            "(topk 1 forces steps + 1)"
        )
    if cfg.page_size is not None and cfg.page_size != DSV4_PAGE_SIZE:
        out.append(f"page_size: {cfg.page_size} -> {DSV4_PAGE_SIZE} (DeepSeek-V4)")
    if cfg.attention_backend is not None and cfg.attention_backend != DSV4_ATTENTION_BACKEND:
        out.append(f"attention_backend: {cfg.attention_backend} -> dsv4 (DeepSeek-V4)")
    if r.spec and not cfg.disable_radix_cache:
        out.append("disable_radix_cache: False -> True (speculative decoding)")
    if cfg.moe_runner_backend == "auto":
        out.append(f"moe_runner_backend: auto -> {r.runner}")
    if (
        cfg.disaggregation_mode != "prefill"
        and r.max_running is not None
        and running_cap(cfg) < r.max_running
    ):
        out.append(
            f"max_running_requests: {r.max_running} -> {running_cap(cfg)} (KV cache capacity)"
        )
    return out


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


def nonstatic_need_bytes(cfg: SimConfig) -> float:
    """Memory outside the static pool the server needs, fragmentation included."""
    r = _resolve(cfg)
    need = NONSTATIC_BASE_BYTES
    mode = cfg.disaggregation_mode
    if mode in ("prefill", "null"):
        need += r.chunk * PREFILL_ACT_BYTES_PER_TOKEN
    if mode in ("decode", "null"):
        if r.graphs:
            need += r.graph_bs * (r.draft if r.spec else 1) * GRAPH_BYTES_PER_TOKEN
        if r.spec:
            need += r.steps * DRAFT_WORKSPACE_BYTES_PER_STEP
    return need * (FRAGMENTATION_EXPANDABLE if r.expandable else FRAGMENTATION)


def _gib(x: float) -> str:
    return f"{x / 2**30:.2f} GiB"


def _rejected(*lines: str) -> StartupFailure:
    return StartupFailure(kind="config_rejected", lines=tuple(lines), after_load=False)


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
    if cfg.quantization is not None and cfg.quantization != _path_checkpoint(cfg):
        return _rejected(
            tb,
            '  File "sglang/srt/configs/model_config.py", line 540, in _verify_quantization',
            "ValueError: Quantization method specified in the model config "
            f"({_path_checkpoint(cfg)}) does not match the quantization method specified in "
            f"the `quantization` argument ({cfg.quantization}).",
        )
    if r.runner == "deep_gemm":
        return _rejected(
            tb,
            '  File "sglang/srt/layers/moe/utils.py", line 118, in get_moe_runner_backend',
            "ValueError: moe_runner_backend 'deep_gemm' requires an FP8 block-quantized "
            f"checkpoint and sm_90/sm_100; got quantization='{_path_checkpoint(cfg)}' on sm_120",
        )
    if r.checkpoint not in RUNNER_DECODE[r.runner]:
        quant = "modelopt_fp4" if r.checkpoint == "nvfp4" else "mxfp4"
        if r.runner == "flashinfer_mxfp4":
            msg = (
                "ValueError: moe_runner_backend 'flashinfer_mxfp4' only supports MXFP4 "
                f"checkpoints (--quantization mxfp4); got quantization='{quant}'"
            )
        else:
            msg = (
                f"ValueError: moe_runner_backend '{r.runner}' requires a ModelOpt FP4/FP8 "
                f"checkpoint (--quantization modelopt_fp4); got quantization='{quant}'"
            )
        return _rejected(
            tb,
            '  File "sglang/srt/layers/quantization/__init__.py", line 301, in '
            "check_moe_runner_backend",
            msg,
        )
    algo = cfg.speculative_algorithm
    if algo in ("STANDALONE", "NGRAM"):
        return _rejected(
            tb,
            '  File "sglang/srt/server_args.py", line 1290, in _handle_speculative_decoding',
            f"ValueError: speculative_algorithm {algo} is not supported for "
            "DeepseekV4ForCausalLM; use EAGLE (MTP/NEXTN)",
        )
    if (
        r.spec
        and cfg.speculative_num_steps is None
        and (cfg.speculative_eagle_topk is not None or cfg.speculative_num_draft_tokens is not None)
    ):
        return _rejected(
            tb,
            '  File "sglang/srt/server_args.py", line 1301, in _handle_speculative_decoding',
            "AssertionError: speculative_eagle_topk and speculative_num_draft_tokens must be "
            "None when speculative_num_steps is None",
        )
    if r.spec and r.topk != 1:
        return _rejected(
            tb,
            '  File "sglang/srt/server_args.py", line 1318, in _handle_speculative_decoding',
            f"ValueError: DeepSeek-V4 only supports speculative_eagle_topk == 1, got {r.topk}",
        )
    if r.spec and not 1 <= r.steps <= 16:
        return _rejected(
            tb,
            f"ValueError: speculative_num_steps must be in [1, 16], got {r.steps}",
        )
    if cfg.triton_attention_num_kv_splits < 1:
        return _rejected(
            tb,
            "ValueError: triton_attention_num_kv_splits must be >= 1, got "
            f"{cfg.triton_attention_num_kv_splits}",
        )
    if cfg.disaggregation_mode != "prefill" and r.max_running is not None and r.max_running < 1:
        return _rejected(tb, "ValueError: max_running_requests must be >= 1")
    # --- memory: happens after the weights are loaded ---
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
    return None


def _oom_failure(cfg: SimConfig, *, need: float, available: float) -> StartupFailure:
    r = _resolve(cfg)
    short = need - available
    tried = max(20 * 2**20, math.ceil(short / (2 * 2**20)) * 2 * 2**20 + 20 * 2**20)
    free = max(0.0, available - (need - short) * 0.0 - tried * 0.5)
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
            '  File "sglang/srt/model_executor/cuda_graph_runner.py", line 384, in __init__',
            "    self.capture()",
            oom,
            "",
            "During handling of the above exception, another exception occurred:",
            "",
            "Exception: Capture cuda graph failed: CUDA out of memory. "
            f"Tried to allocate {_gib(tried)}.",
            "Possible solutions:",
            "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
            "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)",
            "3. disable torch compile by not using --enable-torch-compile",
            "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance "
            "loss)",
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


# ----------------------------------------------------------------------------------------
# Speed
# ----------------------------------------------------------------------------------------
def distinct_experts(tokens: float) -> float:
    """U(T): expected distinct routed experts per layer touched by T tokens (§7)."""
    return N_EXPERTS * (1.0 - ((N_EXPERTS - TOP_K_EXPERTS) / N_EXPERTS) ** max(0.0, tokens))


def accept_probabilities(cfg: SimConfig) -> tuple[float, ...]:
    """Conditional acceptance of draft token k given tokens 1..k-1 were accepted."""
    r = _resolve(cfg)
    if not r.spec:
        return ()
    return tuple(ACCEPT_FIRST * ACCEPT_DECAY**k for k in range(r.steps))


def accept_length(cfg: SimConfig) -> float:
    """Expected tokens per request per decode step (1 without speculative decoding)."""
    total, p = 1.0, 1.0
    for a in accept_probabilities(cfg):
        p *= a
        total += p
    return total


def _nccl_protocol(cfg: SimConfig, nbytes: float) -> str:
    raw = (cfg.nccl_proto or "").replace(" ", "")
    default = ["LL", "Simple"]  # LL128 is off by default without NVLink (§4)
    if not raw:
        allowed = default
    elif raw.startswith("^"):
        excluded = {p.lower() for p in raw[1:].split(",")}
        allowed = [p for p in default if p.lower() not in excluded] or default
    else:
        names = {p.lower() for p in raw.split(",")}
        allowed = [p for p in ("LL", "LL128", "Simple") if p.lower() in names] or default
    if "LL128" in allowed:
        return "LL128"  # NCCL's cost model rates LL128 best at these sizes
    if "LL" in allowed and ("Simple" not in allowed or nbytes <= NCCL_LL_MAX_BYTES):
        return "LL"
    return "Simple"


def _nccl_channels(cfg: SimConfig) -> int:
    ch = NCCL_DEFAULT_CHANNELS
    if cfg.nccl_max_nchannels is not None and cfg.nccl_max_nchannels > 0:
        ch = min(ch, cfg.nccl_max_nchannels)
    if cfg.nccl_min_nchannels is not None and cfg.nccl_min_nchannels > 0:
        ch = max(ch, cfg.nccl_min_nchannels)
    return max(1, min(ch, 64))


def _nccl_tree(cfg: SimConfig) -> bool:
    raw = (cfg.nccl_algo or "").replace(" ", "").lower()
    if raw.startswith("^"):
        return "ring" in raw[1:].split(",") and "tree" not in raw[1:].split(",")
    return raw.split(",")[0] == "tree" if raw else False


@lru_cache(maxsize=4096)
def _allreduce_params(
    cfg: SimConfig,
) -> tuple[str, float, tuple[float, float], tuple[float, float]]:
    """(path, traffic scale, (base, bw) at or below NCCL's LL threshold, (base, bw) above)."""
    path = allreduce_path(cfg)
    if path == "none":
        return path, 0.0, (0.0, 1.0), (0.0, 1.0)
    scale = 2.0 * (cfg.tp_size - 1) / cfg.tp_size / 1.5  # ring traffic relative to TP4
    if path in ("pcie_ipc", "custom"):
        return path, scale, IPC_ALLREDUCE, IPC_ALLREDUCE
    ch = _nccl_channels(cfg)
    tree = _nccl_tree(cfg)

    def params(nbytes: float) -> tuple[float, float]:
        base, bw2, share = NCCL_PROTOCOLS[_nccl_protocol(cfg, nbytes)]
        bw = min(bw2 * ch / NCCL_DEFAULT_CHANNELS, PCIE_ALGBW_MAX * share)
        base += NCCL_PER_CHANNEL_SECONDS * max(0, ch - NCCL_DEFAULT_CHANNELS)
        if ch > NCCL_CONTENTION_CHANNELS:
            bw *= NCCL_CONTENTION_CHANNELS / ch
        if tree:
            base *= NCCL_TREE_FACTORS[0]
            bw *= NCCL_TREE_FACTORS[1]
        return base, bw

    return path, scale, params(NCCL_LL_MAX_BYTES), params(NCCL_LL_MAX_BYTES + 1)


def allreduce_seconds(cfg: SimConfig, nbytes: float) -> float:
    """Latency of one all-reduce of ``nbytes`` across the TP group: base + bytes / algbw."""
    path, scale, small, large = _allreduce_params(cfg)
    if path == "none":
        return 0.0
    base, bw = small if nbytes <= NCCL_LL_MAX_BYTES else large
    return base + nbytes * scale / bw


def attention_splits(cfg: SimConfig, batch: float) -> tuple[int, bool]:
    """(KV splits the decode kernel runs with, whether it is the slow fallback kernel)."""
    r = _resolve(cfg)
    configured = max(1, cfg.triton_attention_num_kv_splits)
    if cfg.static_kv_splits:
        return configured, False
    if r.graphs:
        return 1, True  # dynamic splits cannot be captured: the generic one-split kernel
    s = 1  # eager: the per-batch heuristic picks the largest split that fills the SMs
    while s * 2 <= configured and batch * ATTN_HEAD_GROUPS * s * 2 <= NUM_SMS:
        s *= 2
    return s, False


def _attention_layer_seconds(cfg: SimConfig, batch: float, draft: int) -> float:
    splits, fallback = attention_splits(cfg, batch)
    per_entry = FALLBACK_ENTRY_SECONDS if fallback else KV_ENTRY_SECONDS
    waves = max(1.0, batch * ATTN_HEAD_GROUPS * splits / NUM_SMS)
    t = ATTN_LAYER_FIXED + per_entry * draft * SPARSE_TOPK_TOKENS / splits * waves
    if splits > 1:
        partials = batch * draft * ATTN_HEAD_GROUPS * 4 * splits  # 16 heads per group
        t += SPLIT_REDUCE_FIXED + SPLIT_REDUCE_PER_PARTIAL * partials
    return t


def _moe_seconds(cfg: SimConfig, tokens: float, layers: int, dense_params: float) -> float:
    r = _resolve(cfg)
    bw_eff, tok_s = RUNNER_DECODE[r.runner][r.checkpoint]
    expert_bytes = layers * distinct_experts(tokens) * EXPERT_PARAMS * BYTES_PER_PARAM[r.checkpoint]
    weights = (expert_bytes + dense_params * DENSE_BYTES_PER_PARAM) / max(1, cfg.tp_size)
    return weights / (HBM_BW * bw_eff) + tokens * tok_s * layers / LAYERS


def uses_cuda_graph(cfg: SimConfig, batch: float) -> bool:
    """A decode step replays a graph when graphs are on and the batch fits the largest one."""
    r = _resolve(cfg)
    return r.graphs and batch <= r.graph_bs


def decode_step_breakdown(cfg: SimConfig, batch: float) -> dict[str, float]:
    """Seconds per decode step by component (for the docs and for tests)."""
    r = _resolve(cfg)
    b = max(1.0, float(batch))
    draft = r.draft if r.spec else 1
    tokens = b * draft
    graph = uses_cuda_graph(cfg, b)
    out = {
        "moe_and_dense": _moe_seconds(cfg, tokens, LAYERS, DENSE_PARAMS),
        "attention": LAYERS * _attention_layer_seconds(cfg, b, draft),
        "allreduce": ALLREDUCES_PER_LAYER * LAYERS * allreduce_seconds(cfg, tokens * HIDDEN * 2),
        "launch": GRAPH_REPLAY_SECONDS if graph else EAGER_FORWARD_SECONDS,
        "scheduler": SCHED_FIXED_SECONDS + SCHED_PER_REQUEST_SECONDS * b,
        "draft": 0.0,
    }
    if r.spec:
        lm_head = VOCAB * HIDDEN * DENSE_BYTES_PER_PARAM / max(1, cfg.tp_size) / HBM_BW
        one = (
            _moe_seconds(cfg, b, 1, MTP_DENSE_PARAMS)
            + _attention_layer_seconds(cfg, b, 1)
            + ALLREDUCES_PER_LAYER * allreduce_seconds(cfg, b * HIDDEN * 2)
            + lm_head
            + (DRAFT_GRAPH_SECONDS if graph else DRAFT_EAGER_SECONDS)
        )
        # EAGLE re-runs the draft layer over the verified tokens ("draft extend")
        extend = (
            _moe_seconds(cfg, tokens, 1, MTP_DENSE_PARAMS)
            + _attention_layer_seconds(cfg, b, draft)
            + ALLREDUCES_PER_LAYER * allreduce_seconds(cfg, tokens * HIDDEN * 2)
            + (DRAFT_GRAPH_SECONDS if graph else DRAFT_EAGER_SECONDS)
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
        + tokens * (RUNNER_PREFILL_TOKEN_SECONDS[r.runner] + PREFILL_ATTN_TOKEN_SECONDS)
        + ALLREDUCES_PER_LAYER * LAYERS * allreduce_seconds(cfg, tokens * HIDDEN * 2)
    )


def prefill_seconds(cfg: SimConfig, tokens: int, *, noise: float = 1.0) -> float:
    """Prefill of ``tokens`` tokens, chunked by ``chunked_prefill_size``."""
    chunk = max(1, _resolve(cfg).chunk)
    total, left = 0.0, int(tokens)
    while left > 0:
        total += prefill_forward_seconds(cfg, min(chunk, left))
        left -= chunk
    return total * noise


def serves_wrong_text(cfg: SimConfig) -> bool:
    """LL128 forced over PCIe while all-reduce goes through NCCL corrupts activations (§4)."""
    if allreduce_path(cfg) != "nccl":
        return False
    raw = (cfg.nccl_proto or "").replace(" ", "")
    if raw.startswith("^"):
        return False
    return "ll128" in {p.lower() for p in raw.split(",")}


# ----------------------------------------------------------------------------------------
# Closed-loop expectations (what a load generator at concurrency C measures)
# ----------------------------------------------------------------------------------------
@lru_cache(maxsize=8192)
def as_mode(cfg: SimConfig, mode: str) -> SimConfig:
    """The same configuration seen by a server of another disaggregation mode."""
    return dataclasses.replace(cfg, disaggregation_mode=mode)


def _steps_for(cfg: SimConfig, output_len: int) -> float:
    acc = accept_length(cfg)
    return 1.0 + max(0, output_len - 1) / acc


@dataclass(frozen=True)
class Expectation:
    """Steady-state figures of a closed loop of ``concurrency`` clients."""

    output_throughput: float  # tokens/s
    tpot_s: float
    ttft_s: float
    batch: float  # mean running requests in the decode server
    step_s: float


def expectation(
    cfg: SimConfig,
    *,
    concurrency: int = 16,
    input_len: int,
    output_len: int,
    deployment: str = "pd",
) -> Expectation:
    """Closed-form steady state. ``deployment``: ``pd`` (router -> prefill -> decode, each
    server seeing ``cfg`` in its own mode) or ``decode`` (clients hit the decode server)."""
    dec = as_mode(cfg, "decode")
    failed = startup_failure(dec) is not None
    if deployment == "pd":
        pre = as_mode(cfg, "prefill")
        failed = failed or startup_failure(pre) is not None
        p_service = prefill_seconds(pre, input_len)
        overhead = ROUTER_OVERHEAD_SECONDS + CLIENT_OVERHEAD_SECONDS
    else:
        p_service = 0.0
        overhead = CLIENT_OVERHEAD_SECONDS
    if failed or concurrency < 1 or output_len < 1:
        return Expectation(0.0, math.inf, math.inf, 0.0, math.inf)
    cap = running_cap(dec)
    steps = _steps_for(dec, output_len)
    c = float(concurrency)

    def cycle(b: float) -> tuple[float, float, float]:
        """(decode residence, prefill residence with FIFO queueing, the batch they imply)."""
        r_dec = (steps + 0.5) * decode_step_seconds(dec, b)  # +half a step: join boundary
        rho = min(PREFILL_MAX_UTILISATION, b / r_dec * p_service)
        wait = PREFILL_ARRIVAL_SCV / 2.0 * rho / (1.0 - rho) * p_service  # Kingman, cs^2=0
        p_tot = overhead + p_service + wait
        return r_dec, p_tot, min(float(cap), c * r_dec / (p_tot + r_dec))

    hi = float(min(c, cap))
    if cycle(hi)[2] >= hi - 1e-9:
        b = hi  # decode saturated at its cap (or every client is decoding)
    else:  # bisection on B = C * R(B) / (P + R(B)), monotone in B
        lo = 0.0
        while hi - lo > 1e-4 * max(1.0, hi):
            mid = 0.5 * (lo + hi)
            if cycle(max(mid, 1e-6))[2] > mid:
                lo = mid
            else:
                hi = mid
        b = max(0.5 * (lo + hi), 1e-6)
    r_dec, p_total, _ = cycle(b)
    step = decode_step_seconds(dec, b)
    x = b / r_dec  # requests/s
    if p_service > 0 and x * p_service > 1.0:
        # FIFO prefill is the bottleneck: one request per p_service, fewer in decode
        x = 1.0 / p_service
        b = min(b, x * r_dec)
        step = decode_step_seconds(dec, b)
        r_dec = (steps + 0.5) * step
    tpot = step / accept_length(dec)
    ttft = c / x - r_dec + 1.5 * step
    return Expectation(
        output_throughput=x * output_len,
        tpot_s=tpot,
        ttft_s=max(0.0, ttft),
        batch=b,
        step_s=step,
    )


def expected_output_throughput(
    cfg: SimConfig,
    *,
    concurrency: int = 16,
    input_len: int,
    output_len: int,
    deployment: str = "pd",
) -> float:
    """Output tokens/s a closed loop of ``concurrency`` clients measures (0 if it fails)."""
    return expectation(
        cfg,
        concurrency=concurrency,
        input_len=input_len,
        output_len=output_len,
        deployment=deployment,
    ).output_throughput


def expected_tpot_ms(
    cfg: SimConfig,
    *,
    concurrency: int = 16,
    input_len: int,
    output_len: int,
    deployment: str = "pd",
) -> float:
    """Mean time per output token after the first, in milliseconds (inf if it fails)."""
    return (
        1000.0
        * expectation(
            cfg,
            concurrency=concurrency,
            input_len=input_len,
            output_len=output_len,
            deployment=deployment,
        ).tpot_s
    )


@lru_cache(maxsize=32)
def true_optimum(
    *, concurrency: int = 16, input_len: int, output_len: int, deployment: str = "pd"
) -> Optimum:
    """Best correct lever setting of the lever grid under this model (exact, memoised)."""
    from autotune.sim.optimum import search

    return search(
        concurrency=concurrency,
        input_len=input_len,
        output_len=output_len,
        deployment=deployment,
    )
