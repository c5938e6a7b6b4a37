"""Flags and environment of one simulated SGLang server, parsed like SGLang parses them.

The simulated servers are launched with exactly the command lines and environments a real
SGLang deployment gets, so the parser accepts SGLang's spellings (``--cuda-graph-max-bs``,
``--disaggregation-mode``, ...) and rejects unknown flags with argparse's exit status 2.
``allow_abbrev=False`` matches SGLang: ``--tp`` is not ``--tp-size`` (DOMAIN.md §2).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

MOE_RUNNER_CHOICES = (
    "auto",
    "triton",
    "triton_kernel",
    "marlin",
    "cutlass",
    "flashinfer_cutlass",
    "flashinfer_mxfp4",
    "flashinfer_trtllm",
    "flashinfer_trtllm_routed",
    "deep_gemm",
)
QUANTIZATION_CHOICES = ("mxfp4", "modelopt_fp4", "fp8", "w8a8_fp8", "awq", "gptq", "modelopt")
SPECULATIVE_CHOICES = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
DISAGGREGATION_MODES = ("null", "prefill", "decode")
TRANSFER_BACKENDS = ("mooncake", "nixl", "ascend", "fake")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


@dataclass(frozen=True)
class SimConfig:
    """Everything that decides what one simulated server does: flags plus environment.

    ``None`` means "not given" so that :func:`autotune.sim.perf_model.resolve` can show the
    defaults and silent rewrites SGLang would apply.
    """

    model_path: str
    served_model_name: str | None = None
    tp_size: int = 1
    host: str = "127.0.0.1"
    port: int = 30000
    disaggregation_mode: str = "null"
    disaggregation_bootstrap_port: int = 8998
    disaggregation_transfer_backend: str = "mooncake"
    moe_runner_backend: str = "auto"
    quantization: str | None = None
    mem_fraction_static: float | None = None
    disable_custom_all_reduce: bool = False
    cuda_graph_max_bs: int | None = None
    cuda_graph_max_bs_decode: int | None = None
    disable_cuda_graph: bool = False
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    page_size: int | None = None
    speculative_algorithm: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    triton_attention_num_kv_splits: int = 8
    enable_metrics: bool = False
    disable_radix_cache: bool = False
    attention_backend: str | None = None
    trust_remote_code: bool = False
    base_gpu_id: int = 0
    log_level: str = "info"
    context_length: int | None = None
    random_seed: int | None = None
    # --- environment ---
    nccl_proto: str | None = None
    nccl_algo: str | None = None
    nccl_min_nchannels: int | None = None
    nccl_max_nchannels: int | None = None
    pcie_ipc_allreduce: bool = False
    pytorch_cuda_alloc_conf: str | None = None
    static_kv_splits: bool = False
    cuda_visible_devices: str | None = None
    # --- sim-only environment ---
    sim_load_seconds: float = 0.3
    sim_noise: float = 0.03
    sim_seed: int | None = None
    sim_time_scale: float = 1.0  # stress tests only: every simulated duration x this
    sim_kv_scale: float = 1.0  # stress tests only: KV capacity x this
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        # The perf model memoises on configs: hash once, not 45 fields on every lookup.
        key = tuple(getattr(self, f.name) for f in fields(self) if f.name != "_hash")
        object.__setattr__(self, "_hash", hash(key))

    def __hash__(self) -> int:
        return self._hash


def _bool_env(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("1", "true", "yes", "on")


def _int_env(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        # NCCL ignores unparsable integers and keeps its default; so do we.
        return None


def _float_env(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError:
        return default


def build_parser() -> argparse.ArgumentParser:
    """The subset of SGLang's ``launch_server`` parser the deployments use."""
    p = argparse.ArgumentParser(
        prog="python -m autotune.sim.server",
        description="Simulated SGLang server (DeepSeek-V4-Flash on RTX PRO 6000, PCIe).",
        allow_abbrev=False,
    )
    p.add_argument("--model-path", "--model", dest="model_path", required=True)
    p.add_argument("--tokenizer-path")
    p.add_argument("--served-model-name")
    p.add_argument("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    p.add_argument("--ep-size", type=int, default=1)
    p.add_argument("--dp-size", type=int, default=1)
    p.add_argument("--enable-dp-attention", action="store_true")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--disaggregation-mode", choices=DISAGGREGATION_MODES, default="null")
    p.add_argument("--disaggregation-bootstrap-port", type=int, default=8998)
    p.add_argument(
        "--disaggregation-transfer-backend", choices=TRANSFER_BACKENDS, default="mooncake"
    )
    p.add_argument("--disaggregation-ib-device")
    p.add_argument("--moe-runner-backend", choices=MOE_RUNNER_CHOICES, default="auto")
    p.add_argument("--quantization", choices=QUANTIZATION_CHOICES)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--disable-custom-all-reduce", action="store_true")
    p.add_argument("--cuda-graph-max-bs", type=int)
    p.add_argument("--cuda-graph-max-bs-decode", type=int)
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--chunked-prefill-size", type=int)
    p.add_argument("--page-size", type=int)
    p.add_argument("--speculative-algorithm", choices=SPECULATIVE_CHOICES)
    p.add_argument("--speculative-num-steps", type=int)
    p.add_argument("--speculative-eagle-topk", type=int)
    p.add_argument("--speculative-num-draft-tokens", type=int)
    p.add_argument("--triton-attention-num-kv-splits", type=int, default=8)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--attention-backend")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--base-gpu-id", type=int, default=0)
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    p.add_argument("--context-length", type=int)
    p.add_argument("--random-seed", type=int)
    p.add_argument("--watchdog-timeout", type=float)
    p.add_argument("--skip-server-warmup", action="store_true")
    p.add_argument("--stream-interval", type=int, default=1)
    return p


def parse_config(argv: Sequence[str], env: Mapping[str, str]) -> SimConfig:
    """Parse SGLang flags and the environment into a :class:`SimConfig`.

    Unknown or malformed flags make argparse print its usage message and raise
    ``SystemExit(2)``, as SGLang does.
    """
    ns = build_parser().parse_args(list(argv))
    seed_raw = env.get("AUTOTUNE_SIM_SEED")
    try:
        sim_seed = int(seed_raw) if seed_raw not in (None, "") else None
    except ValueError:
        sim_seed = None
    return SimConfig(
        model_path=ns.model_path,
        served_model_name=ns.served_model_name,
        tp_size=ns.tp_size,
        host=ns.host,
        port=ns.port,
        disaggregation_mode=ns.disaggregation_mode,
        disaggregation_bootstrap_port=ns.disaggregation_bootstrap_port,
        disaggregation_transfer_backend=ns.disaggregation_transfer_backend,
        moe_runner_backend=ns.moe_runner_backend,
        quantization=ns.quantization,
        mem_fraction_static=ns.mem_fraction_static,
        disable_custom_all_reduce=ns.disable_custom_all_reduce,
        cuda_graph_max_bs=ns.cuda_graph_max_bs,
        cuda_graph_max_bs_decode=ns.cuda_graph_max_bs_decode,
        disable_cuda_graph=ns.disable_cuda_graph,
        max_running_requests=ns.max_running_requests,
        chunked_prefill_size=ns.chunked_prefill_size,
        page_size=ns.page_size,
        speculative_algorithm=ns.speculative_algorithm,
        speculative_num_steps=ns.speculative_num_steps,
        speculative_eagle_topk=ns.speculative_eagle_topk,
        speculative_num_draft_tokens=ns.speculative_num_draft_tokens,
        triton_attention_num_kv_splits=ns.triton_attention_num_kv_splits,
        enable_metrics=ns.enable_metrics,
        disable_radix_cache=ns.disable_radix_cache,
        attention_backend=ns.attention_backend,
        trust_remote_code=ns.trust_remote_code,
        base_gpu_id=ns.base_gpu_id,
        log_level=ns.log_level,
        context_length=ns.context_length,
        random_seed=ns.random_seed,
        nccl_proto=env.get("NCCL_PROTO") or None,
        nccl_algo=env.get("NCCL_ALGO") or None,
        nccl_min_nchannels=_int_env(env, "NCCL_MIN_NCHANNELS"),
        nccl_max_nchannels=_int_env(env, "NCCL_MAX_NCHANNELS"),
        pcie_ipc_allreduce=env.get("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "").strip() == "1",
        pytorch_cuda_alloc_conf=env.get("PYTORCH_CUDA_ALLOC_CONF") or None,
        static_kv_splits=_bool_env(env.get("SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS")),
        cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
        sim_load_seconds=max(0.0, _float_env(env, "AUTOTUNE_SIM_LOAD_SECONDS", 0.3)),
        sim_noise=max(0.0, _float_env(env, "AUTOTUNE_SIM_NOISE", 0.03)),
        sim_seed=sim_seed,
        # AUTOTUNE_SIM_SPEEDUP=8 runs the whole simulation 8x faster than the modeled hardware.
        sim_time_scale=max(
            1e-6,
            _float_env(env, "AUTOTUNE_SIM_TIME_SCALE", 1.0)
            / max(1e-6, _float_env(env, "AUTOTUNE_SIM_SPEEDUP", 1.0)),
        ),
        sim_kv_scale=max(1e-6, _float_env(env, "AUTOTUNE_SIM_KV_SCALE", 1.0)),
    )
