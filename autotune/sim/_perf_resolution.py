"""What SGLang 0.5.23 does to the arguments before it serves: defaults filled in (memory
fraction, chunk, max running, speculative steps), NEXTN -> EAGLE, the MoE runner ``auto``, the
CUDA-graph backend and capture sizes, the PCIe IPC all-reduce limit; one cached
:class:`_Resolved` per configuration.

Part of :mod:`autotune.sim.perf_model` (docs/performance-model.md §1). Every other part of the
model reads these figures through :func:`_resolve` (one ``lru_cache`` for the whole model), so
this module sits just above the platform constants; what ``/server_info`` shows of it is in
:mod:`autotune.sim._perf_server_info`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from autotune.sim._perf_platform import (
    DEFAULT_CHUNKED_PREFILL,
    DEFAULT_CUDA_GRAPH_MAX_BS,
    DEFAULT_MEM_FRACTION,
    DSV4_DEFAULT_MAX_RUNNING,
    DSV4_DEFAULT_SPEC,
    DSV4_PAGE_SIZE,
    HIDDEN,
    IPC_ALLREDUCE_WORLD,
    SPEC_DEFAULT_MAX_RUNNING,
)
from autotune.sim.args import SimConfig

# ----------------------------------------------------------------------------------------
# Resolution: what SGLang does to the arguments
# ----------------------------------------------------------------------------------------
# Decode graph capture sizes [arg_groups/cuda_graph_hook.py generate_decode_cuda_graph_batch_sizes]
_GRAPH_BS_PLAIN = (1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16))
_GRAPH_BS_SPEC = (*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8))


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
