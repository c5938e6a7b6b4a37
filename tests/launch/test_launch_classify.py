"""classify_log against real-world failure lines (PyTorch, NCCL, SGLang, HF, uvicorn)."""

from __future__ import annotations

import pytest

from autotune.launch import Classification, FailureClass, classify_log, explain_fault

F = FailureClass

REAL_LINES = [
    (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 94.97 GiB of which 1.12 GiB is free.",
        F.cuda_oom,
    ),
    ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB", F.cuda_oom),
    (
        "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 1.50 GiB",
        F.cuda_oom,
    ),
    ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", F.cuda_oom),
    (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "NCCLUtils.hpp:275, unhandled system error, NCCL version 2.21.5",
        F.nccl_error,
    ),
    ("ncclUnhandledCudaError: Call to CUDA function failed.", F.nccl_error),
    ("node1:1234:5678 [0] NCCL WARN Connect to 10.0.0.2<43891> failed : timeout", F.nccl_error),
    (
        "[rank0]:[E1029 10:00:00.000 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1) ran for 600000 "
        "milliseconds before timing out.",
        F.nccl_error,
    ),
    ("OSError: [Errno 98] Address already in use", F.port_in_use),
    (
        "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 30000): "
        "address already in use",
        F.port_in_use,
    ),
    (
        "OSError: Incorrect path_or_model_id: '/models/DeepSeek-V4-Flash'. Please provide either "
        "the path to a local folder or the repo_id of a model on the Hub.",
        F.model_path_missing,
    ),
    (
        "OSError: /models/DeepSeek-V4-Flash does not appear to have a file named config.json. "
        "Checkout 'https://huggingface.co//models/DeepSeek-V4-Flash/tree/None' for available files.",  # noqa: E501
        F.model_path_missing,
    ),
    (
        "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or "
        "'namespace/repo_name': '/models/DeepSeek-V4-Flash-NVFP4'.",
        F.model_path_missing,
    ),
    (
        "FileNotFoundError: [Errno 2] No such file or directory: "
        "'/models/DeepSeek-V4-Flash-NVFP4/config.json'",
        F.model_path_missing,
    ),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", F.cuda_error),
    (
        "RuntimeError: The NVIDIA driver on your system is too old. CUDA driver version is "
        "insufficient for CUDA runtime version",
        F.cuda_error,
    ),
    ("RuntimeError: No CUDA GPUs are available", F.cuda_error),
    (
        "ValueError: flashinfer_cutlass MoE runner is not supported for quantization mxfp4",
        F.config_rejected,
    ),
    (
        "launch_server.py: error: unrecognized arguments: --speculative-eagle-depth 3",
        F.config_rejected,
    ),
    (
        "launch_server.py: error: argument --moe-runner-backend: invalid choice: 'marlinx' "
        "(choose from 'auto', 'triton', 'marlin')",
        F.config_rejected,
    ),
    ("ValueError: chunked_prefill_size must be divisible by page_size", F.config_rejected),
    # transformers serve (continuous batching): the worker thread's OOM, the paged KV cache
    # sized beyond free memory, a KV cache smaller than one request.
    (
        "ERROR:transformers.generation.continuous_batching.continuous_api:Error in generation "
        "loop: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
        "has a total capacity of 139.72 GiB of which 1.06 GiB is free.",
        F.cuda_oom,
    ),
    (
        "MemoryError: Memory footprint 151263477760 is more than available memory 126437097062",
        F.cuda_oom,
    ),
    (
        "RuntimeError: No requests can be scheduled and no requests can be offloaded.",
        F.config_rejected,
    ),
]


@pytest.mark.parametrize(("line", "expected"), REAL_LINES)
def test_real_lines(line: str, expected: FailureClass) -> None:
    log = f"[2025-11-29 10:00:00] server_args=ServerArgs(...)\nLoading weights...\n{line}\n"
    result = classify_log(log)
    assert result.failure == expected
    assert result.line == line.strip()


def test_most_specific_wins_over_order() -> None:
    # An OOM reported through NCCL is an OOM; a generic ValueError loses to a CUDA error.
    log = (
        "torch.distributed.DistBackendError: NCCL error in: NCCLUtils.hpp:275, unhandled cuda "
        "error\nncclUnhandledCudaError: Call to CUDA function failed.\n"
        "Last error:\nCuda failure 'out of memory'\n"
    )
    assert classify_log(log).failure == F.cuda_oom
    log2 = "ValueError: something odd\nRuntimeError: CUDA error: device-side assert triggered\n"
    assert classify_log(log2) == Classification(
        F.cuda_error,
        "RuntimeError: CUDA error: device-side assert triggered",
    )


def test_first_line_of_equal_rank_is_the_reason() -> None:
    log = "NCCL error in: a.cpp:1\nsomething\nRuntimeError: NCCL error in: b.cpp:2\n"
    assert classify_log(log).line == "NCCL error in: a.cpp:1"


def test_nothing_matches() -> None:
    assert classify_log("INFO: all fine\nWARNING: NCCL WARN minor thing\n") == Classification(
        F.unknown, ""
    )
    assert classify_log("") == Classification(F.unknown, "")


def test_failure_class_values_match_trial_schema() -> None:
    assert {c.value for c in F} == {
        "cuda_oom",
        "nccl_error",
        "port_in_use",
        "model_path_missing",
        "cuda_error",
        "config_rejected",
        "readiness_timeout",
        "exited",
        "host_unreachable",
        "crashed",
        "trial_timeout",
        "compile_timeout",
        "unknown",
        # Stored by the pipeline and the loop; string literals in the runner until they
        # joined the one enum of autotune/failures.py.
        "wrong_output",
        "bench_failed",
        "request_errors",
        "forbidden",
        "interrupted",
        "worker_lost",
        "claimed",
        # the energy objective on a trial without GPU telemetry (autotune/study/objectives.py)
        "no_telemetry",
    }
    assert str(F.cuda_oom) == "cuda_oom" and F("nccl_error") is F.nccl_error
    assert (
        F.compile_timeout.value == "compile_timeout" and str(F.compile_timeout) == "compile_timeout"
    )
    assert F("compile_timeout") is F.compile_timeout


# --------------------------------------------------------------------------- explain_fault

TF_OOM = (
    "ERROR:transformers.generation.continuous_batching.continuous_api:Error in generation loop: "
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 139.72 GiB of which 1.06 GiB is free."
)
ACCESS = 'INFO:     127.0.0.1:53290 - "POST /v1/completions HTTP/1.1" 200 OK'
TRACING = "torch._dynamo.symbolic_convert: [INFO] Step 1: torchdynamo start tracing forward"
COMPILE_LOG = (
    "INFO:     Uvicorn running on http://127.0.0.1:8000 (Press CTRL+C to quit)\n"
    f"I0101 10:00:00.000 123 {TRACING} /models/llama/modeling_llama.py:400\n"
    "I0101 10:00:01.000 123 torch/_dynamo/symbolic_convert.py:3000] [0/0] Step 1: torchdynamo "
    "done tracing forward (RETURN_VALUE)\n"
)


@pytest.mark.parametrize("stalled", [False, True])
def test_explain_fault_finds_an_oom_under_many_access_lines(stalled: bool) -> None:
    # The worker thread died of an OOM; every later request got an error and an access line.
    log = "\n".join(
        ["INFO:     Application startup complete.", *[ACCESS] * 50, TF_OOM, *[ACCESS] * 1500]
    )
    found = explain_fault(log, stalled=stalled)
    assert found == Classification(F.cuda_oom, TF_OOM)


def test_explain_fault_names_specific_causes_of_a_live_server() -> None:
    footprint = "MemoryError: Memory footprint 151263477760 is more than available memory 1264"
    assert explain_fault(f"{ACCESS}\n{footprint}\n{ACCESS}\n", stalled=False) == Classification(
        F.cuda_oom,
        footprint,
    )
    rejected = "RuntimeError: No requests can be scheduled and no requests can be offloaded."
    assert explain_fault(f"{ACCESS}\n  {rejected}  \n", stalled=False) == Classification(
        F.config_rejected,
        rejected,
    )
    cuda = "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert explain_fault(cuda, stalled=True) == Classification(F.cuda_error, cuda)


def test_explain_fault_compile_markers_only_count_when_stalled() -> None:
    found = explain_fault(COMPILE_LOG, stalled=True)
    assert found is not None
    assert found.failure is F.compile_timeout
    assert TRACING in found.line and found.line == found.line.strip()
    assert found.line.startswith("I0101 10:00:00.000")  # the first marker, not the last
    # Answered requests failing for another reason: compiling is not why.
    assert explain_fault(COMPILE_LOG, stalled=False) is None


@pytest.mark.parametrize(
    "marker",
    [
        "[INFO] Step 1: torchdynamo start tracing forward",
        "torch._dynamo.output_graph: [INFO] calling compiler function inductor",
        "torch._inductor.compile_fx: [INFO] Step 3: torchinductor compiling FORWARDS graph 0",
        "W0101 torch._dynamo hit config.recompile_limit (8)",
    ],
)
def test_explain_fault_compile_markers(marker: str) -> None:
    found = explain_fault(f"{ACCESS}\n{marker}\n{ACCESS}\n", stalled=True)
    assert found == Classification(F.compile_timeout, marker)


def test_explain_fault_no_compile_marker_in_plain_text() -> None:
    # "dynamo" alone (e.g. TORCH_LOGS=dynamo echoed in a banner) is not torch.compile at work.
    assert explain_fault("env TORCH_LOGS=dynamo\nINFO: ready\n", stalled=True) is None


def test_explain_fault_ignores_generic_errors() -> None:
    # Matches classify_log (config_rejected at a generic priority) but is too generic here.
    assert classify_log("ValueError: x").failure is F.config_rejected
    assert explain_fault("ValueError: x", stalled=False) is None
    assert explain_fault("ValueError: x\n", stalled=True) is None
    assert explain_fault(f"{ACCESS}\nValueError: x\n{ACCESS}\n", stalled=True) is None


def test_explain_fault_oom_wins_over_compile_markers_when_stalled() -> None:
    for log in (f"{COMPILE_LOG}{TF_OOM}\n", f"{TF_OOM}\n{COMPILE_LOG}"):
        assert explain_fault(log, stalled=True) == Classification(F.cuda_oom, TF_OOM)


def test_explain_fault_empty_or_quiet_log() -> None:
    assert explain_fault("", stalled=True) is None
    assert explain_fault("", stalled=False) is None
    assert explain_fault("\n".join([ACCESS] * 100), stalled=True) is None
