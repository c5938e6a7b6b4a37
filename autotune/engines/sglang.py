"""SGLang (``sglang serve`` / ``python -m sglang.launch_server``), manifest from
``ServerArgs.add_cli_args`` of the pinned release, variables from ``srt/environ.py``."""

from __future__ import annotations

from typing import ClassVar

from autotune.engines._base import (
    BaseEngine,
    EngineMetrics,
    FailurePattern,
    RequestQuirks,
    StartStage,
)


class SGLangEngine(BaseEngine):
    name: ClassVar[str] = "sglang"
    default_version: ClassVar[str | None] = "0.5.23"
    programs: ClassVar[tuple[str, ...]] = (
        "sglang.launch_server",
        "sglang serve",
        "autotune.sim.server",
    )
    env_prefixes: ClassVar[tuple[str, ...]] = ("SGLANG_",)
    failure_patterns: ClassVar[tuple[FailurePattern, ...]] = (
        # srt/model_executor/model_runner*.py: the KV pool does not fit after the weights.
        FailurePattern(
            90, "cuda_oom", r"Not enough memory\. Please try to increase --mem-fraction"
        ),
        # srt/entrypoints/http_server.py: the scheduler died during start-up.
        FailurePattern(40, "exited", r"Initialization failed\. (warmup|scheduler)"),
    )
    # srt/model_executor/model_runner.py's start-up lines, in order (the simulated server
    # prints the same): its own capture failure says "Capture cuda graph failed", a plain
    # CUDA OOM says nothing of where.
    start_stages: ClassVar[tuple[StartStage, ...]] = (
        StartStage(r"Load weight begin\.", "loading the weights"),
        StartStage(r"KV Cache is allocated\.", "starting up after the KV cache was allocated"),
        StartStage(r"Capture cuda graph begin\.", "capturing CUDA graphs"),
        StartStage(r"Capture cuda graph end\.", "warming up after CUDA-graph capture"),
    )
    # srt/observability/metrics_collector.py (scheduler gauges labelled model_name,
    # engine_type, tp_rank, pp_rank, moe_ep_rank)
    metrics: ClassVar[EngineMetrics] = EngineMetrics(
        running="sglang:num_running_reqs",
        queued="sglang:num_queue_reqs",
        kv_usage="sglang:token_usage",
        prompt_tokens="sglang:prompt_tokens_total",
        generation_tokens="sglang:generation_tokens_total",
        ttft="sglang:time_to_first_token_seconds",
        itl="sglang:inter_token_latency_seconds",
        e2e="sglang:e2e_request_latency_seconds",
        preemptions="sglang:num_retracted_requests_total",
        spec_accept_length="sglang:spec_accept_length",
    )
    # OpenAI endpoints accept ignore_eos and end streams with [DONE]; any model name is served.
    # Text prompts: a PD deployment is reached through sglang-router, whose /v1/completions
    # takes a string or a list of strings only (token ids: HTTP 422, "StringOrArray").
    quirks: ClassVar[RequestQuirks] = RequestQuirks(
        ignore_eos=True, require_done=True, prompt="text"
    )
    version_path: ClassVar[str | None] = "/server_info"
    # srt/entrypoints/http_server.py: flush_cache (GET/POST), refused while requests run.
    cache_flush_path: ClassVar[str | None] = "/flush_cache"
