"""The fixed facts of the performance model: the hardware (RTX PRO 6000 Blackwell on PCIe),
the model (DeepSeek-V4-Flash) and SGLang 0.5.23's settings and defaults for them.

Part of :mod:`autotune.sim.perf_model` (import from there; this module is its implementation).
These constants are read by every other part of the model (resolution, memory, kernels,
all-reduce, step times), so they sit in one module below all of them; a constant that only one
part reads lives beside that part's formulas instead. The source tags of every constant of the
model are explained in the comment below.
"""

from __future__ import annotations

from autotune.sim.args import SGLANG_VERSION as _SGLANG_VERSION

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
