"""Performance model of DeepSeek-V4-Flash on 8x RTX PRO 6000 Blackwell (PCIe), PD-disaggregated,
served by SGLang 0.5.23.

Pure functions of a :class:`~autotune.sim.args.SimConfig`: no I/O, no clock, no randomness
except through explicit ``noise`` arguments. ``docs/performance-model.md`` writes every
formula down with its constants and their sources; section numbers (§) refer to
``DOMAIN.md``, file names to the SGLang 0.5.23 source (``python/sglang/``). Constants marked
"calibrated" have no public measurement behind them and are set so that the seeds'
deployment reproduces what was measured there (25 tok/s and TPOT ~500 ms at C=16, 63% of
decode time in the Triton sparse-MLA kernel, +24% for NVFP4 on tensor cores, the MTP
verifier halving the batch).

Why one module of ~1,200 lines: it is one model, written down formula by formula in
``docs/performance-model.md`` in the same order; one file keeps every constant beside the
section that justifies it.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache

from autotune.sim.args import SGLANG_VERSION as _SGLANG_VERSION
from autotune.sim.args import SimConfig

# Source tags: [§n] DOMAIN.md section; [datasheet] NVIDIA RTX PRO 6000 Blackwell datasheet;
# [SGLang file] the SGLang 0.5.23 source; [calibrated] set so the seeds' measurements come out
# (25 tok/s, TPOT ~500 ms, 63% attention, +24% NVFP4, halved batch; §1); [estimate] an
# engineering estimate of the right magnitude with no public measurement behind it.
# ----------------------------------------------------------------------------------------
# Hardware
# ----------------------------------------------------------------------------------------
GPU_MEM_BYTES = 94.97 * 2**30  # [datasheet] 96 GB GDDR7; torch reports 94.97 GiB capacity
HBM_BW = 1.792e12  # [datasheet, §7] bytes/s, 512-bit GDDR7
NUM_SMS = 188  # [datasheet, §7]
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
# SGLang 0.5.23 behaviour
# ----------------------------------------------------------------------------------------
SGLANG_VERSION = _SGLANG_VERSION
DSV4_PAGE_SIZE = 256  # [arg_groups/model_overrides/deepseek_v4.py] page size 256 ...
DSV4_ATTENTION_BACKEND = "dsv4"  # [same] ... and attention backend dsv4, always
DSV4_KV_CACHE_DTYPES = ("fp8_e4m3", "bfloat16")  # [arg_groups/overrides.py] auto -> fp8_e4m3
DSV4_DEFAULT_MAX_RUNNING = 256  # [arg_groups/deepseek_v4_hook.py] max_running_requests
SPEC_DEFAULT_MAX_RUNNING = 48  # [arg_groups/speculative_hook.py, §2] with EAGLE
DSV4_SPEC_ALGORITHMS = ("EAGLE", "DSPARK")  # [deepseek_v4_hook.py] the only ones accepted
DSV4_DEFAULT_SPEC = (3, 1, 4)  # [SGLang] auto steps/topk/draft for DeepSeek MTP (seeds ran 3/1/4)
DEFAULT_CHUNKED_PREFILL = 8192  # [arg_groups/memory_hook.py] GPUs of 90-160 GB
DEFAULT_MEM_FRACTION = 0.88  # [estimate] memory_hook.py's derived default here (seeds: 0.88)
DEFAULT_CUDA_GRAPH_MAX_BS = 512  # [memory_hook.py] 90-160 GB GPUs, tp >= 4 (capped: max running)
SM120_DECODE_MAX_TOKENS = 64  # [kernels/ops/attention/flash_mla_sm120.py]
SM120_FLASHMLA_BACKENDS = ("flashinfer", "triton", "torch")  # [srt/environ.py] default flashinfer
CUDA_GRAPH_BACKENDS = ("full", "breakable", "disabled")  # [model_executor/cuda_graph_config.py]
NCCL_DEFAULT_CHANNELS = 2  # [estimate] NCCL's ring channel count for 4 GPUs on PCIe
NCCL_LL_MAX_BYTES = 64 * 1024  # [estimate] NCCL's tuner switches LL -> Simple here on PCIe
IPC_ALLREDUCE_WORLD = (2, 4, 8)  # [distributed/device_communicators/pcie_ipc_ar.py]
IPC_FALLBACK_ROWS = 64  # [pcie_ipc_ar.py] _FALLBACK_DECODE_WIDTH without a decode config
CUSTOM_AR_MAX_BYTES = 8 * 2**20  # [custom_all_reduce.py] one-shot buffer
# Decode graph capture sizes [arg_groups/cuda_graph_hook.py generate_decode_cuda_graph_batch_sizes]
_GRAPH_BS_PLAIN = (1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16))
_GRAPH_BS_SPEC = (*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8))

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
# [pcie_ipc_ar.py, §7] FlashInfer PCIe IPC all-reduce: 5-39x faster than NCCL at decode sizes
IPC_ALLREDUCE = (6e-6, 12e9)

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
PREFILL_FORWARD_SECONDS = 15e-3  # [estimate] prefill runs eager: launches + Python
ROUTER_OVERHEAD_SECONDS = 1.5e-3  # [estimate] two extra HTTP hops through the PD router
CLIENT_OVERHEAD_SECONDS = 0.5e-3  # [estimate] one HTTP request/response
# [calibrated against the simulator's own PD closed loop] FIFO prefill queue, Kingman's
# G/D/1: closed-loop arrivals are more regular than Poisson (squared CV 0.6)
PREFILL_ARRIVAL_SCV = 0.6
PREFILL_MAX_UTILISATION = 0.98

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
    graph_backend: str  # full | breakable | disabled (decode phase)
    graph_sizes: tuple[int, ...]  # captured decode batch sizes, ascending
    graph_bs: int  # the largest of them (cuda_graph_config.decode.max_bs)
    chunk: int
    page_size: int
    kv_cache_dtype: str
    attn: str  # SGLANG_SM120_FLASHMLA_BACKEND
    radix_disabled: bool
    expandable: bool
    ipc_max_bytes: float  # largest all-reduce the PCIe IPC workspace serves (0: off)

    @property
    def graphs(self) -> bool:
        return self.graph_backend != "disabled"

    @property
    def tokens_per_request(self) -> int:
        return self.draft if self.spec else 1


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


def _spec_algorithm(cfg: SimConfig) -> str | None:
    algo = cfg.speculative_algorithm
    return "EAGLE" if algo == "NEXTN" else algo  # [§2] NEXTN becomes EAGLE


def _graph_backend(cfg: SimConfig) -> str:
    """cuda_graph_hook.py parse_cuda_graph_config: explicit backend > off-switches > legacy."""
    if cfg.cuda_graph_backend_decode is not None:
        return cfg.cuda_graph_backend_decode
    if cfg.disable_cuda_graph or cfg.disable_decode_cuda_graph:
        return "disabled"
    if cfg.disaggregation_mode == "prefill":
        return "disabled"  # apply_cuda_graph_disaggregation_roles
    return "full"


@lru_cache(maxsize=4096)
def _resolve(cfg: SimConfig) -> _Resolved:
    ckpt = checkpoint_of(cfg)
    runner = cfg.moe_runner_backend
    if runner == "auto":  # [§2, model_overrides/deepseek_v4.py] on sm_120
        runner = "flashinfer_mxfp4" if ckpt == "mxfp4" else "flashinfer_trtllm_routed"
    algo = _spec_algorithm(cfg)
    spec = algo == "EAGLE"
    steps = topk = draft = 0
    if spec:
        if cfg.speculative_num_steps is None:
            steps, topk, draft = DSV4_DEFAULT_SPEC
        else:
            steps = cfg.speculative_num_steps
            topk = cfg.speculative_eagle_topk if cfg.speculative_eagle_topk is not None else 1
            draft = steps + 1 if topk == 1 else (cfg.speculative_num_draft_tokens or steps + 1)
    max_running = cfg.max_running_requests
    if max_running is None:
        max_running = SPEC_DEFAULT_MAX_RUNNING if spec else DSV4_DEFAULT_MAX_RUNNING
    # memory_hook.py: an explicit list sets max_bs; else max_bs (default capped by the
    # running limit) generates the list
    if cfg.cuda_graph_bs_decode:
        sizes = tuple(sorted({b for b in cfg.cuda_graph_bs_decode if b > 0})) or (1,)
    else:
        if cfg.cuda_graph_max_bs_decode is not None:
            max_bs = max(1, cfg.cuda_graph_max_bs_decode)
        else:
            max_bs = min(DEFAULT_CUDA_GRAPH_MAX_BS, max(1, max_running))
        base = _GRAPH_BS_SPEC if spec else _GRAPH_BS_PLAIN
        sizes = tuple(sorted({*(b for b in base if b <= max_bs), max_bs}))
    rows = sizes[-1] * (draft if spec else 1)
    ipc = 0.0
    if cfg.pcie_ipc_allreduce and cfg.tp_size in IPC_ALLREDUCE_WORLD:
        if cfg.pcie_ipc_max_numel > 0:
            ipc = cfg.pcie_ipc_max_numel * 2.0  # bf16 elements
        else:
            ipc = float(rows * HIDDEN * 2)
    kv_dtype = "fp8_e4m3" if cfg.kv_cache_dtype == "auto" else cfg.kv_cache_dtype
    return _Resolved(
        checkpoint=ckpt,
        runner=runner,
        mem=cfg.mem_fraction_static
        if cfg.mem_fraction_static is not None
        else DEFAULT_MEM_FRACTION,
        spec=spec,
        spec_algorithm=algo,
        steps=steps,
        topk=topk,
        draft=draft,
        max_running=max_running,
        graph_backend=_graph_backend(cfg),
        graph_sizes=sizes,
        graph_bs=sizes[-1],
        chunk=cfg.chunked_prefill_size
        if cfg.chunked_prefill_size is not None
        else DEFAULT_CHUNKED_PREFILL,
        page_size=DSV4_PAGE_SIZE,
        kv_cache_dtype=kv_dtype,
        attn=cfg.sm120_flashmla_backend,
        radix_disabled=cfg.disable_radix_cache or spec or cfg.disaggregation_mode == "decode",
        expandable=_expandable(cfg),
        ipc_max_bytes=ipc,
    )


def allreduce_path(cfg: SimConfig, nbytes: float = HIDDEN * 2) -> str:
    """``none`` (TP1), ``pcie_ipc``, ``custom`` (TP2 custom all-reduce) or ``nccl`` for one
    all-reduce of ``nbytes`` (default: one decode token)."""
    if cfg.tp_size <= 1:
        return "none"
    r = _resolve(cfg)
    if nbytes <= r.ipc_max_bytes:
        return "pcie_ipc"
    # custom_all_reduce.py should_custom_ar: world size 2, or full NVLink (absent here)
    if cfg.tp_size == 2 and not cfg.disable_custom_all_reduce and nbytes <= CUSTOM_AR_MAX_BYTES:
        return "custom"
    return "nccl"


def cuda_graph_config(cfg: SimConfig) -> dict[str, dict[str, object]]:
    """The resolved ``cuda_graph_config`` (decode phase as the model sees it)."""
    r = _resolve(cfg)
    prefill_backend = "disabled"  # deepseek_v4: breakable prefill disabled; decode role too
    return {
        "decode": {"backend": r.graph_backend, "max_bs": r.graph_bs, "bs": list(r.graph_sizes)},
        "prefill": {"backend": prefill_backend, "max_bs": min(8192, r.chunk), "bs": None},
    }


def resolve(cfg: SimConfig) -> dict[str, object]:
    """The resolved server arguments as SGLang's ``/server_info`` shows them (ServerArgs
    field names)."""
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
        "flashinfer_mxfp4_moe_precision": cfg.flashinfer_mxfp4_moe_precision,
        "quantization": cfg.quantization or _path_checkpoint(cfg),
        "kv_cache_dtype": r.kv_cache_dtype,
        "mem_fraction_static": r.mem,
        "disable_custom_all_reduce": cfg.disable_custom_all_reduce,
        "cuda_graph_backend_decode": r.graph_backend,
        "cuda_graph_max_bs_decode": r.graph_bs,
        "cuda_graph_bs_decode": list(r.graph_sizes),
        "cuda_graph_config": cuda_graph_config(cfg),
        "disable_cuda_graph": cfg.disable_cuda_graph,
        "disable_overlap_schedule": cfg.disable_overlap_schedule,
        "max_running_requests": running_cap(cfg)
        if cfg.disaggregation_mode != "prefill"
        else r.max_running,
        "chunked_prefill_size": r.chunk,
        "page_size": r.page_size,
        "attention_backend": DSV4_ATTENTION_BACKEND,
        "dsv4_prefill_backend": cfg.dsv4_prefill_backend,
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
    """Human-readable list of settings the server changed (or ignores) without being asked."""
    r = _resolve(cfg)
    out: list[str] = []
    if cfg.speculative_algorithm == "NEXTN":
        out.append("speculative_algorithm: NEXTN -> EAGLE")
    if cfg.max_running_requests is None and cfg.disaggregation_mode != "prefill":
        why = "speculative" if r.spec else "DeepSeek-V4"
        out.append(f"max_running_requests: None -> {r.max_running} ({why})")
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
    if cfg.kv_cache_dtype == "auto":
        out.append("kv_cache_dtype: auto -> fp8_e4m3 (DeepSeek-V4)")
    if r.spec and not cfg.disable_radix_cache:
        out.append("disable_radix_cache: False -> True (speculative decoding)")
    elif cfg.disaggregation_mode == "decode" and not cfg.disable_radix_cache:
        out.append("disable_radix_cache: False -> True (PD decode)")
    if cfg.moe_runner_backend == "auto":
        out.append(f"moe_runner_backend: auto -> {r.runner}")
    if (
        cfg.disaggregation_mode != "prefill"
        and cfg.cuda_graph_max_bs_decode is None
        and not cfg.cuda_graph_bs_decode
    ):
        out.append(f"cuda_graph_max_bs_decode: None -> {r.graph_bs}")
    if cfg.cuda_graph_bs_decode and cfg.cuda_graph_max_bs_decode not in (None, r.graph_bs):
        out.append(
            f"cuda_graph_max_bs_decode: {cfg.cuda_graph_max_bs_decode} -> {r.graph_bs} "
            "(max of --cuda-graph-bs-decode)"
        )
    if cfg.tp_size > 2 and not cfg.disable_custom_all_reduce:
        out.append(
            f"custom all-reduce not used: world size {cfg.tp_size} without full NVLink "
            "(custom_all_reduce.py)"
        )
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


# ----------------------------------------------------------------------------------------
# Speed
# ----------------------------------------------------------------------------------------
def distinct_experts(tokens: float) -> float:
    """U(T): expected distinct routed experts per layer touched by T tokens (§7)."""
    return N_EXPERTS * (1.0 - ((N_EXPERTS - TOP_K_EXPERTS) / N_EXPERTS) ** max(0.0, tokens))


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
def _nccl_params(cfg: SimConfig) -> tuple[float, tuple[float, float], tuple[float, float]]:
    """(traffic scale, (base, bw) at or below NCCL's LL threshold, (base, bw) above)."""
    scale = 2.0 * (cfg.tp_size - 1) / cfg.tp_size / 1.5  # ring traffic relative to TP4
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

    return scale, params(NCCL_LL_MAX_BYTES), params(NCCL_LL_MAX_BYTES + 1)


def allreduce_seconds(cfg: SimConfig, nbytes: float) -> float:
    """Latency of one all-reduce of ``nbytes`` across the TP group: base + bytes / algbw."""
    path = allreduce_path(cfg, nbytes)
    if path == "none":
        return 0.0
    scale = 2.0 * (cfg.tp_size - 1) / cfg.tp_size / 1.5
    if path in ("pcie_ipc", "custom"):
        base, bw = IPC_ALLREDUCE
        return base + nbytes * scale / bw
    scale, small, large = _nccl_params(cfg)
    base, bw = small if nbytes <= NCCL_LL_MAX_BYTES else large
    return base + nbytes * scale / bw


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


def serves_wrong_text(cfg: SimConfig) -> bool:
    """LL128 forced over PCIe while the decode-size all-reduce goes through NCCL corrupts
    activations (§4)."""
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


def _steps_for(acc: float, output_len: int) -> float:
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
    prefill: SimConfig | None = None,
    shared_prefix: int = 0,
) -> Expectation:
    """Closed-form steady state. ``deployment``: ``pd`` (router -> prefill -> decode) or
    ``decode`` (clients hit the decode server). The decode server is ``cfg`` in decode mode;
    the prefill server is ``prefill`` (in prefill mode), by default ``cfg`` in prefill mode.
    ``shared_prefix``: the first tokens of every prompt that the prefill's radix cache holds
    in the steady state (a shared system prompt that fits in the cache); 0 for random
    prompts."""
    dec = as_mode(cfg, "decode")
    failed = startup_failure(dec) is not None
    if deployment == "pd":
        pre = as_mode(prefill if prefill is not None else cfg, "prefill")
        failed = failed or startup_failure(pre) is not None
        p_service = prompt_prefill_seconds(pre, input_len, shared_prefix=shared_prefix)
        overhead = ROUTER_OVERHEAD_SECONDS + CLIENT_OVERHEAD_SECONDS
        by_prefill = _resolve(pre).spec
    else:
        p_service = 0.0
        overhead = CLIENT_OVERHEAD_SECONDS
        by_prefill = False
    if failed or concurrency < 1 or output_len < 1:
        return Expectation(0.0, math.inf, math.inf, 0.0, math.inf)
    cap = running_cap(dec)
    acc = accept_length(dec, seeded=by_prefill)
    steps = _steps_for(acc, output_len)
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
    tpot = step / acc
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
    prefill: SimConfig | None = None,
    shared_prefix: int = 0,
) -> float:
    """Output tokens/s a closed loop of ``concurrency`` clients measures (0 if it fails)."""
    return expectation(
        cfg,
        concurrency=concurrency,
        input_len=input_len,
        output_len=output_len,
        deployment=deployment,
        prefill=prefill,
        shared_prefix=shared_prefix,
    ).output_throughput


def expected_tpot_ms(
    cfg: SimConfig,
    *,
    concurrency: int = 16,
    input_len: int,
    output_len: int,
    deployment: str = "pd",
    prefill: SimConfig | None = None,
    shared_prefix: int = 0,
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
            prefill=prefill,
            shared_prefix=shared_prefix,
        ).tpot_s
    )
