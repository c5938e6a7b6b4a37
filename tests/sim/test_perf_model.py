from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.sim import perf_model as pm
from autotune.sim.args import SimConfig, parse_config
from autotune.sim.levers import (
    BASELINE,
    CATEGORIES,
    changed_levers,
    config_from_levers,
    sample_levers,
    violations,
)

IN, OUT = 1024, 256
NVFP4 = {**BASELINE, "checkpoint": "nvfp4", "moe_runner_backend": "flashinfer_cutlass"}


def thr(levers: dict[str, object]) -> float:
    return pm.expected_output_throughput(config_from_levers(levers), input_len=IN, output_len=OUT)


@pytest.fixture(scope="module")
def optimum() -> pm.Optimum:
    return pm.true_optimum(concurrency=16, input_len=IN, output_len=OUT)


# ---- calibration targets -------------------------------------------------------------
@pytest.mark.parametrize(("i", "o"), [(IN, OUT), (128, 128), (4096, 1024)])
def test_baseline_is_25_tok_s_and_500_ms_tpot(i: int, o: int) -> None:
    cfg = config_from_levers(BASELINE)
    assert 20 <= pm.expected_output_throughput(cfg, input_len=i, output_len=o) <= 30
    assert 400 <= pm.expected_tpot_ms(cfg, input_len=i, output_len=o) <= 600


def test_nvfp4_on_tensor_cores_is_worth_about_24_percent() -> None:
    gain = thr(NVFP4) / thr(BASELINE) - 1
    assert 0.18 <= gain <= 0.30


def test_seeds_slow_kernel_dominates_baseline() -> None:
    dec = config_from_levers(BASELINE, mode="decode")
    parts = pm.decode_step_breakdown(dec, pm.running_cap(dec))
    assert pm.attention_splits(dec, 12) == (1, True)  # graphs + dynamic splits: fallback
    assert 0.55 <= parts["attention"] / sum(parts.values()) <= 0.75


def test_mtp_verifier_memory_halves_the_effective_batch() -> None:
    spec = config_from_levers(BASELINE, mode="decode")
    nospec = config_from_levers(
        {**BASELINE, "speculative": "off", "max_running_requests": 128}, mode="decode"
    )
    assert pm.running_cap(spec) == 12
    assert pm.running_cap(spec) <= 0.5 * pm.running_cap(nospec)


def test_best_joint_setting(optimum: pm.Optimum) -> None:
    assert 1000 <= optimum.throughput <= 1300
    cfg = config_from_levers(optimum.levers)
    assert not pm.serves_wrong_text(cfg)
    assert not violations(optimum.levers)
    assert thr(optimum.levers) == pytest.approx(optimum.throughput)
    assert len(optimum.changed) >= 4
    assert 10 <= optimum.tpot_ms <= 20


def test_no_two_lever_change_from_baseline_comes_close(optimum: pm.Optimum) -> None:
    domains: dict[str, list[object]] = {k: list(v) for k, v in CATEGORIES.items()}
    del domains["nccl_channels"]  # only meaningful with its two counts: see below
    domains |= {
        "nccl_min_nchannels": [
            {"nccl_channels": True, "nccl_min_nchannels": c, "nccl_max_nchannels": c}
            for c in (1, 4, 16)
        ],
        "speculative_num_steps": [1, 2, 4],
        "mem_fraction_static": [0.7, 0.8, 0.9, 0.95],
        "cuda_graph_max_bs": [16, 32, 256],
        "max_running_requests": [8, 16, 128],
        "chunked_prefill_size": [2048, 16384],
    }
    best = 0.0
    for a, b in itertools.combinations(domains, 2):
        for va, vb in itertools.product(domains[a], domains[b]):
            levers = {**BASELINE}
            for name, value in ((a, va), (b, vb)):
                levers |= value if isinstance(value, dict) else {name: value}
            if not violations(levers) and not pm.serves_wrong_text(config_from_levers(levers)):
                best = max(best, thr(levers))
    assert best < 0.5 * optimum.throughput


def test_few_random_settings_come_close(optimum: pm.Optimum) -> None:
    rng = random.Random(2024)
    n, near, moderate, ok = 20000, 0, 0, 0
    best = 0.0
    for _ in range(n):
        levers = sample_levers(rng)
        cfg = config_from_levers(levers)
        value = pm.expected_output_throughput(cfg, input_len=IN, output_len=OUT)
        if value <= 0:
            continue
        ok += 1
        moderate += 40 <= value <= 600
        if pm.serves_wrong_text(cfg):
            continue
        best = max(best, value)
        if value >= 0.95 * optimum.throughput:
            near += 1
            assert len(changed_levers(levers)) >= 4
    assert best <= optimum.throughput * (1 + 1e-9)  # the search is exact
    assert near / n < 0.01
    assert moderate / ok > 0.6  # most trials are neither absurdly slow nor near-optimal
    assert ok / n > 0.8  # start-up failures exist but are not the norm


def test_wrong_text_config_is_fast_enough_to_fool_an_ungated_tuner(optimum: pm.Optimum) -> None:
    wrong = {**optimum.levers, "pcie_ipc_allreduce": False, "nccl_proto": "LL128"}
    assert pm.serves_wrong_text(config_from_levers(wrong))
    assert thr(wrong) > optimum.throughput


def test_exactly_one_combination_serves_wrong_text() -> None:
    for proto, ipc, car in itertools.product(
        CATEGORIES["nccl_proto"], (False, True), (False, True)
    ):
        levers = {
            **BASELINE,
            "nccl_proto": proto,
            "pcie_ipc_allreduce": ipc,
            "custom_all_reduce": car,
        }
        assert pm.serves_wrong_text(config_from_levers(levers)) == (proto == "LL128" and not ipc)
    cfg = parse_config(["--model-path", "/m", "--tp-size", "4"], {"NCCL_PROTO": "^LL128"})
    assert not pm.serves_wrong_text(cfg)
    cfg = parse_config(["--model-path", "/m", "--tp-size", "4"], {"NCCL_PROTO": "LL,LL128"})
    assert pm.serves_wrong_text(cfg)


# ---- resolution: silent rewrites ----------------------------------------------------------
def test_resolve_shows_silent_rewrites() -> None:
    cfg = parse_config(
        [
            "--model-path",
            "/models/DeepSeek-V4-Flash",
            "--tp-size",
            "4",
            "--speculative-algorithm",
            "NEXTN",
            "--speculative-num-steps",
            "2",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "7",
            "--page-size",
            "64",
            "--attention-backend",
            "triton",
            "--cuda-graph-max-bs",
            "24",
            "--disaggregation-mode",
            "decode",
        ],
        {},
    )
    info = pm.resolve(cfg)
    assert info["disable_custom_all_reduce"] is True  # TP4 over PCIe, no NVLink
    assert info["speculative_algorithm"] == "EAGLE"
    assert info["speculative_num_draft_tokens"] == 3  # topk 1 forces steps + 1
    assert info["page_size"] == 256 and info["attention_backend"] == "dsv4"
    assert info["cuda_graph_max_bs"] == 24 and info["cuda_graph_max_bs_decode"] == 24
    assert info["disable_radix_cache"] is True
    assert info["quantization"] == "mxfp4" and info["moe_runner_backend"] == "flashinfer_mxfp4"
    assert info["max_running_requests"] == min(48, pm.kv_slots(cfg))  # spec default 48
    rewrites = "\n".join(pm.silent_rewrites(cfg))
    assert "disable_custom_all_reduce" in rewrites and "NEXTN -> EAGLE" in rewrites
    tp2 = dataclasses.replace(cfg, tp_size=2)
    assert pm.resolve(tp2)["disable_custom_all_reduce"] is False


def test_spec_defaults_when_steps_unset() -> None:
    cfg = parse_config(
        ["--model-path", "/m", "--tp-size", "4", "--speculative-algorithm", "EAGLE"], {}
    )
    info = pm.resolve(cfg)
    assert (
        info["speculative_num_steps"],
        info["speculative_eagle_topk"],
        info["speculative_num_draft_tokens"],
    ) == (3, 1, 4)
    bad = parse_config(
        [
            "--model-path",
            "/m",
            "--tp-size",
            "4",
            "--speculative-algorithm",
            "EAGLE",
            "--speculative-eagle-topk",
            "1",
        ],
        {},
    )
    failure = pm.startup_failure(bad)
    assert failure is not None and failure.kind == "config_rejected"


# ---- start-up failures ----------------------------------------------------------------------
def test_oom_when_graph_and_mtp_memory_do_not_fit() -> None:
    levers = {**BASELINE, "mem_fraction_static": 0.95, "cuda_graph_max_bs": 256}
    failure = pm.startup_failure(config_from_levers(levers, mode="decode"))
    assert failure is not None and failure.kind == "cuda_oom" and failure.exit_code == 1
    text = "\n".join(failure.lines)
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in text
    assert "Capture cuda graph failed" in text
    # smaller graphs, no MTP or less static memory all fit
    for fix in (
        {"cuda_graph_max_bs": 8, "mem_fraction_static": 0.9},
        {"mem_fraction_static": 0.80},
        {"speculative": "off", "cuda_graph_max_bs": 16},
    ):
        assert pm.startup_failure(config_from_levers({**levers, **fix}, mode="decode")) is None


def test_expandable_segments_lower_the_oom_threshold() -> None:
    levers = {
        **BASELINE,
        "mem_fraction_static": 0.95,
        "speculative_num_steps": 2,
        "cuda_graph_max_bs": 16,
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
    assert (
        pm.expected_output_throughput(config_from_levers(levers), input_len=IN, output_len=OUT)
        == 0.0
    )


@pytest.mark.parametrize(
    ("runner", "ckpt", "needle"),
    [
        ("flashinfer_cutlass", "mxfp4", "requires a ModelOpt FP4"),
        ("flashinfer_mxfp4", "nvfp4", "only supports MXFP4"),
    ],
)
def test_runner_checkpoint_mismatch_refuses_to_start(runner: str, ckpt: str, needle: str) -> None:
    cfg = config_from_levers({**BASELINE, "moe_runner_backend": runner, "checkpoint": ckpt})
    failure = pm.startup_failure(cfg)
    assert failure is not None and failure.kind == "config_rejected" and not failure.after_load
    assert any(line.startswith("ValueError:") and needle in line for line in failure.lines)


def test_chunk_not_multiple_of_page_size_refuses() -> None:
    cfg = parse_config(["--model-path", "/m", "--chunked-prefill-size", "1000"], {})
    failure = pm.startup_failure(cfg)
    assert failure is not None and "divisible by page_size (256)" in failure.lines[-1]


# ---- structural properties ----------------------------------------------------------------
def dec(*parts: dict[str, object], **levers: object) -> SimConfig:
    merged: dict[str, object] = {**BASELINE}
    for part in parts:
        merged |= part
    return config_from_levers({**merged, **levers}, mode="decode")


def test_component_levers_move_the_right_component() -> None:
    fast = {**NVFP4, "speculative": "off", "cuda_graph_max_bs": 16}
    base = pm.decode_step_breakdown(dec(fast), 16)
    ipc = pm.decode_step_breakdown(dec(fast, pcie_ipc_allreduce=True), 16)
    ll = pm.decode_step_breakdown(dec(fast, nccl_proto="LL"), 16)
    assert ipc["allreduce"] < ll["allreduce"] < base["allreduce"]
    static = pm.decode_step_breakdown(
        dec(fast, static_kv_splits=True, triton_attention_num_kv_splits=4), 16
    )
    assert static["attention"] < base["attention"] / 10
    eager = pm.decode_step_breakdown(dec(fast, cuda_graph_max_bs=8), 16)
    assert eager["launch"] > 10 * base["launch"]
    marlin = pm.decode_step_breakdown(
        dec(fast, moe_runner_backend="marlin", checkpoint="mxfp4"), 16
    )
    assert marlin["moe_and_dense"] > 5 * base["moe_and_dense"]


def test_more_draft_tokens_touch_more_experts() -> None:
    assert pm.distinct_experts(1) == pytest.approx(6.0)
    # DOMAIN §7 quotes U(16)=80.5, U(64)=203 (rounded)
    assert pm.distinct_experts(16) == pytest.approx(80.5, abs=0.5)
    assert pm.distinct_experts(64) == pytest.approx(203, abs=4)
    steps = [pm.decode_step_seconds(dec(NVFP4, speculative_num_steps=s), 16) for s in (1, 2, 3, 4)]
    assert steps == sorted(steps)
    lengths = [pm.accept_length(dec(NVFP4, speculative_num_steps=s)) for s in (1, 2, 3, 4)]
    assert lengths == sorted(lengths) and lengths[0] == pytest.approx(1.7)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batch=st.integers(1, 127))
def test_step_time_grows_with_batch_and_is_pure(seed: int, batch: int) -> None:
    cfg = config_from_levers(sample_levers(random.Random(seed)), mode="decode")
    a = pm.decode_step_seconds(cfg, batch)
    assert pm.decode_step_seconds(cfg, batch + 1) >= a > 0
    assert pm.decode_step_seconds(cfg, batch) == a
    assert pm.decode_step_seconds(cfg, batch, noise=1.1) == pytest.approx(1.1 * a)
    assert 0 < pm.prefill_seconds(cfg, 2048) <= pm.prefill_seconds(cfg, 4096)


def test_tpot_and_throughput_agree() -> None:
    cfg = config_from_levers(
        {
            **NVFP4,
            "speculative": "off",
            "cuda_graph_max_bs": 16,
            "pcie_ipc_allreduce": True,
            "static_kv_splits": True,
        }
    )
    e = pm.expectation(cfg, concurrency=16, input_len=IN, output_len=OUT, deployment="decode")
    assert e.tpot_s == pytest.approx(e.step_s)
    assert e.output_throughput == pytest.approx(e.batch * OUT / ((OUT + 0.5) * e.step_s))
    assert e.batch == pytest.approx(16, rel=1e-3)
