"""The performance model's start-up failures: OOM from graphs, MTP and prefill chunks, runner
and checkpoint mismatches, refused chunk sizes. Split from test_perf_model.py."""

from __future__ import annotations

import pytest

from autotune.sim import perf_model as pm
from autotune.sim.args import parse_config
from autotune.sim.levers import (
    BASELINE,
    config_from_levers,
    violations,
)

from .perf_helpers import NVFP4, served, thr


# ---- start-up failures ----------------------------------------------------------------------
def test_oom_when_graph_and_mtp_memory_do_not_fit() -> None:
    levers = {**BASELINE, "mem_fraction_static": 0.95, "cuda_graph_max_bs_decode": 256}
    failure = pm.startup_failure(config_from_levers(levers, mode="decode"))
    assert failure is not None and failure.kind == "cuda_oom" and failure.exit_code == 1
    text = "\n".join(failure.lines)
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in text
    assert "Capture cuda graph failed" in text and "--cuda-graph-max-bs-decode" in text
    # smaller graphs, no MTP or less static memory all fit
    for fix in (
        {"cuda_graph_max_bs_decode": 8, "mem_fraction_static": 0.9},
        {"mem_fraction_static": 0.80},
        {"speculative": "off", "cuda_graph_max_bs_decode": 16},
    ):
        assert pm.startup_failure(config_from_levers({**levers, **fix}, mode="decode")) is None


def test_expandable_segments_lower_the_oom_threshold() -> None:
    levers = {
        **BASELINE,
        "mem_fraction_static": 0.95,
        "speculative_num_steps": 2,
        "cuda_graph_max_bs_decode": 16,
    }
    failure = pm.startup_failure(config_from_levers(levers, mode="decode"))
    assert failure is not None and failure.kind == "cuda_oom"
    fixed = {**levers, "pytorch_alloc_conf": "expandable_segments:True"}
    assert pm.startup_failure(config_from_levers(fixed, mode="decode")) is None


def test_prefill_oom_depends_on_chunk_size() -> None:
    levers = {**BASELINE, "mem_fraction_static": 0.95, "chunked_prefill_size": 16384}
    failure = pm.startup_failure(config_from_levers(levers, mode="prefill"))
    assert failure is not None and failure.kind == "cuda_oom"
    small = {**levers, "chunked_prefill_size": 4096}
    assert pm.startup_failure(config_from_levers(small, mode="prefill")) is None
    assert thr(levers) == 0.0


@pytest.mark.parametrize(
    ("runner", "ckpt", "needle"),
    [
        ("flashinfer_cutlass", "mxfp4", "FlashInfer Cutlass MOE supports only"),
        ("flashinfer_cutedsl", "mxfp4", "FlashInfer CuteDSL MOE currently supports only"),
        ("flashinfer_mxfp4", "nvfp4", "only supports MXFP4"),
    ],
)
def test_runner_checkpoint_mismatch_refuses_to_start(runner: str, ckpt: str, needle: str) -> None:
    cfg = config_from_levers({**BASELINE, "moe_runner_backend": runner, "checkpoint": ckpt})
    failure = pm.startup_failure(cfg)
    assert failure is not None and failure.kind == "config_rejected" and not failure.after_load
    assert any(needle in line for line in failure.lines)


@pytest.mark.parametrize("runner", ["auto", "flashinfer_trtllm_routed", "flashinfer_trtllm"])
def test_trtllm_gen_runners_fail_on_sm120(runner: str) -> None:
    """auto resolves the NVFP4 hybrid checkpoint to flashinfer_trtllm_routed (DOMAIN.md §2),
    whose trtllm-gen kernels are SM100-only (overrides.py): it loads, then fails."""
    cfg = served(
        {**NVFP4, "moe_runner_backend": "flashinfer_cutlass"},
        "decode",
        ["--moe-runner-backend", runner],
    )
    assert pm.resolve(cfg)["moe_runner_backend"] in (
        "flashinfer_trtllm_routed",
        "flashinfer_trtllm",
    )
    failure = pm.startup_failure(cfg)
    assert failure is not None and failure.after_load and "SM100-only" in "\n".join(failure.lines)
    assert violations({**NVFP4, "moe_runner_backend": "auto"})  # the space forbids it
    mx = served(BASELINE, "decode", ["--moe-runner-backend", "auto"])
    assert pm.resolve(mx)["moe_runner_backend"] == "flashinfer_mxfp4"
    assert pm.startup_failure(mx) is None


def test_chunk_not_multiple_of_page_size_refuses() -> None:
    cfg = parse_config(["--model-path", "/m", "--chunked-prefill-size", "1000"], {})
    failure = pm.startup_failure(cfg)
    assert failure is not None and "divisible by page_size (256)" in failure.lines[-1]
