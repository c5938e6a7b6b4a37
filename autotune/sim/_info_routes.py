"""The simulated server's endpoints that generate nothing: health, models, info, cache, metrics.

``/health``, ``/v1/models``, ``/server_info`` and ``/model_info`` (as SGLang 0.5.23
answers them, with its deprecated aliases), ``/flush_cache`` and ``/metrics``. Separate
from ``server`` because these handlers only read the process state (``/flush_cache``
aside, which asks the engine), while the generation handlers live in ``_generate_routes``.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from autotune.sim import perf_model as pm
from autotune.sim._engine import SLOT_TOKENS
from autotune.sim._state import State, _error, _state
from autotune.sim.args import SimConfig


async def health(request: web.Request) -> web.Response:
    if not _state(request).ready:
        return web.Response(status=503, text="")
    return web.Response(status=200, text="")


async def models(request: web.Request) -> web.Response:
    st = _state(request)
    name = st.engine.model_name
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "sglang",
                    "root": st.cfg.model_path,
                    "max_model_len": pm.resolve(st.cfg)["context_length"],
                }
            ],
        }
    )


def _cuda_graph_bs(info: dict[str, Any], cfg: SimConfig) -> list[int]:
    """Decode CUDA-graph batch sizes captured (SGLang's list: 1, 2, 4, then steps of 8)."""
    if cfg.disaggregation_mode == "prefill" or not pm.uses_cuda_graph(cfg, 1):
        return []
    sizes = info.get("cuda_graph_bs_decode")  # the resolved list (perf_model.resolve)
    if isinstance(sizes, list) and sizes:
        return [int(b) for b in sizes]
    top = info.get("cuda_graph_max_bs_decode", info.get("cuda_graph_max_bs"))
    if not isinstance(top, int) or isinstance(top, bool) or top <= 0:
        return []
    return [b for b in (1, 2, 4) if b <= top] + list(range(8, top + 1, 8))


def _server_info(st: State) -> dict[str, Any]:
    """``GET /server_info`` of SGLang 0.5.23: the resolved ServerArgs fields, the launch
    command, the scheduler's start-up info, ``internal_states`` (one per DP rank: the
    resolved fields again plus live scheduler state), ``version`` and ``frontend``."""
    cfg, eng = st.cfg, st.engine
    resolved = dict(pm.resolve(cfg))
    slots = pm.kv_slots(cfg)
    total_tokens = max(1, slots) * SLOT_TOKENS
    context = resolved.get("context_length")
    max_input = min(
        (int(context) if isinstance(context, int) else total_tokens) - 1, total_tokens - 1
    )
    weights_gb = pm._weights_bytes_per_gpu(cfg, pm.checkpoint_of(cfg)) / 2**30
    state: dict[str, Any] = {
        **resolved,
        "world_size": cfg.tp_size,
        "startup_time": st.startup_time,
        "effective_max_running_requests_per_dp": max(1, pm.running_cap(cfg)),
        "last_gen_throughput": round(eng.gen_throughput(), 3),
        "memory_usage": {
            "weight": round(weights_gb, 3),
            "kvcache": round(pm.kv_pool_bytes(cfg) / 2**30, 3),
            "startup_available": round(pm.GPU_MEM_BYTES / 2**30 - 0.6, 3),
            "token_capacity": total_tokens,
            "token_capacity_swa": None,
            "graph": {},
        },
        "disaggregation_mode": cfg.disaggregation_mode,
        "decode_cuda_graph_bs": _cuda_graph_bs(resolved, cfg),
        "decode_cuda_graph_memory_gb": 0.0,
    }
    if cfg.speculative_algorithm and eng.accept_slots:
        state["avg_spec_accept_length"] = eng.accept_tokens / eng.accept_slots
    return {
        **resolved,
        "launch_command": shlex.join(st.argv),
        "status": "ready",
        "max_total_num_tokens": total_tokens,
        "max_req_input_len": max_input,
        "startup_time": st.startup_time,
        "hicache_object_layout": None,
        "kv_events": None,
        "internal_states": [state],
        "version": pm.SGLANG_VERSION,
        "frontend": "python",
    }


async def server_info(request: web.Request) -> web.Response:
    return web.json_response(_server_info(_state(request)))


async def model_info(request: web.Request) -> web.Response:
    """``GET /model_info`` (the router reads it when it registers a worker)."""
    st = _state(request)
    return web.json_response(
        {
            "model_path": st.cfg.model_path,
            "served_model_name": st.engine.model_name,
            "tokenizer_path": st.cfg.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": "auto",
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": st.cfg.disaggregation_mode,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "deepseek_v4",
            "architectures": ["DeepseekV4ForCausalLM"],
        }
    )


def _deprecated_alias(
    old: str, new: str, handler: Callable[[web.Request], Awaitable[web.Response]]
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """An old endpoint name that still answers, with SGLang's deprecation warning."""

    async def alias(request: web.Request) -> web.Response:
        _state(request).log.warning(
            f"Endpoint '{old}' is deprecated and will be removed in a future version. "
            f"Please use '{new}' instead."
        )
        return await handler(request)

    return alias


async def flush_cache(request: web.Request) -> web.Response:
    """``/flush_cache`` (GET or POST): empty the radix cache when idle; ``?timeout=S`` waits
    up to S seconds for idleness (scheduler_components/flush_wrapper.py), else HTTP 400."""
    st = _state(request)
    try:
        timeout = max(0.0, float(request.query.get("timeout", 0) or 0))
    except ValueError:
        return _error(400, "timeout must be a number")
    deadline = time.monotonic() + timeout
    while timeout > 0 and not st.engine.idle() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    if timeout > 0 and not st.engine.idle():
        return web.Response(status=400, text="Timed out waiting for idle state.")
    if not st.engine.flush():
        return web.Response(status=400, text="Flush cache failed.\n")
    return web.Response(
        text="Cache flushed.\nPlease check backend logs for more details. "
        "(When there are running or waiting requests, the operation "
        "will not be performed.)\n"
    )


async def metrics(request: web.Request) -> web.Response:
    st = _state(request)
    if not st.cfg.enable_metrics:
        return web.Response(status=404, text="404: Not Found")
    return web.Response(text=st.engine.metrics_text(), content_type="text/plain", charset="utf-8")
