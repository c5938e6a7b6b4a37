"""classify_log against real-world failure lines (PyTorch, NCCL, SGLang, HF, uvicorn)."""

from __future__ import annotations

import pytest

from autotune.launch import FailureClass, classify_log

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
    assert classify_log(log2) == (
        F.cuda_error,
        "RuntimeError: CUDA error: device-side assert triggered",
    )


def test_first_line_of_equal_rank_is_the_reason() -> None:
    log = "NCCL error in: a.cpp:1\nsomething\nRuntimeError: NCCL error in: b.cpp:2\n"
    assert classify_log(log).line == "NCCL error in: a.cpp:1"


def test_nothing_matches() -> None:
    assert classify_log("INFO: all fine\nWARNING: NCCL WARN minor thing\n") == (F.unknown, "")
    assert classify_log("") == (F.unknown, "")


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
        "unknown",
    }
    assert str(F.cuda_oom) == "cuda_oom" and F("nccl_error") is F.nccl_error
