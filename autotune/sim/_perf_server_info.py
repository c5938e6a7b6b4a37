"""What ``/server_info`` shows of the model: the resolved server arguments under
``ServerArgs`` field names (:func:`resolve`, with :func:`cuda_graph_config`) and the settings
SGLang changed or ignores without being asked (:func:`silent_rewrites`).

Part of :mod:`autotune.sim.perf_model` (docs/performance-model.md §1). Apart from the
resolution itself (:mod:`autotune.sim._perf_resolution`) because both show the running cap,
which the memory model computes from the resolved figures.
"""

from __future__ import annotations

from autotune.sim._perf_memory import running_cap
from autotune.sim._perf_platform import DSV4_ATTENTION_BACKEND, DSV4_PAGE_SIZE
from autotune.sim._perf_resolution import _path_checkpoint, _resolve
from autotune.sim.args import SimConfig


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
