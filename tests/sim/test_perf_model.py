from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.engines._manifest import load_manifest
from autotune.sim import perf_model as pm
from autotune.sim.args import SimConfig, parse_config
from autotune.sim.levers import (
    BASELINE,
    CATEGORIES,
    changed_levers,
    config_from_levers,
    levers_to_command,
    pd_configs,
    sample_levers,
    violations,
)
from autotune.sim.optimum import Optimum, true_optimum

IN, OUT = 1024, 256
NVFP4 = {**BASELINE, "checkpoint": "nvfp4", "moe_runner_backend": "flashinfer_cutlass"}
FAST = {
    **NVFP4,
    "sm120_flashmla_backend": "flashinfer",
    "speculative": "off",
    "cuda_graph_max_bs_decode": 16,
    "pcie_ipc_allreduce": True,
}


def thr(levers: Mapping[str, object], i: int = IN, o: int = OUT) -> float:
    pre, dec = pd_configs(levers)
    return pm.expected_output_throughput(dec, prefill=pre, input_len=i, output_len=o)


def tpot(levers: Mapping[str, object], i: int = IN, o: int = OUT) -> float:
    pre, dec = pd_configs(levers)
    return pm.expected_tpot_ms(dec, prefill=pre, input_len=i, output_len=o)


def served(
    levers: Mapping[str, object],
    mode: str,
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> SimConfig:
    """What a server of ``mode`` parses from the levers' command plus ``extra`` flags."""
    argv, lever_env = levers_to_command(levers, mode=mode)
    return parse_config([*argv, *extra], {**lever_env, **(env or {})})


def pd_thr(
    levers: Mapping[str, object],
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> float:
    """Throughput when both servers get ``extra`` flags and ``env`` on top of the levers."""
    pre = served(levers, "prefill", extra, env)
    dec = served(levers, "decode", extra, env)
    return pm.expected_output_throughput(dec, prefill=pre, input_len=IN, output_len=OUT)


@pytest.fixture(scope="module")
def optimum() -> Optimum:
    return true_optimum(concurrency=16, input_len=IN, output_len=OUT)


# ---- calibration targets -------------------------------------------------------------
@pytest.mark.parametrize(("i", "o"), [(IN, OUT), (128, 128), (4096, 1024), (256, 128)])
def test_baseline_is_25_tok_s_and_500_ms_tpot(i: int, o: int) -> None:
    assert 20 <= thr(BASELINE, i, o) <= 30
    assert 400 <= tpot(BASELINE, i, o) <= 600


def test_nvfp4_on_tensor_cores_is_worth_about_24_percent() -> None:
    gain = thr(NVFP4) / thr(BASELINE) - 1
    assert 0.18 <= gain <= 0.30


def test_seeds_slow_kernel_dominates_baseline() -> None:
    """63% of decode time in the Triton sparse-MLA kernel (DOMAIN.md §1)."""
    dec = config_from_levers(BASELINE, mode="decode")
    assert pm.attention_backend(dec) == "triton"
    parts = pm.decode_step_breakdown(dec, pm.running_cap(dec))
    assert 0.55 <= parts["attention"] / sum(parts.values()) <= 0.75


def test_flashmla_backend_is_the_big_lever() -> None:
    base = thr(BASELINE)
    flashinfer = thr({**BASELINE, "sm120_flashmla_backend": "flashinfer"})
    assert flashinfer > 3 * base
    dec = config_from_levers(FAST, mode="decode")
    times = {
        backend: pm.decode_step_breakdown(
            config_from_levers({**FAST, "sm120_flashmla_backend": backend}, mode="decode"), 16
        )["attention"]
        for backend in CATEGORIES["sm120_flashmla_backend"]
    }
    assert times["flashinfer"] < times["torch"] < times["triton"]
    assert times["flashinfer"] < 0.1 * pm.decode_step_seconds(dec, 16)


def test_torch_backend_runs_out_of_memory_at_large_prefill_chunks() -> None:
    torch = {**FAST, "sm120_flashmla_backend": "torch"}
    failure = pm.startup_failure(config_from_levers(torch, mode="prefill"))
    assert failure is not None and failure.kind == "cuda_oom"
    small = {**torch, "chunked_prefill_size": 1024}
    assert pm.startup_failure(config_from_levers(small, mode="prefill")) is None
    assert 0 < thr(small) < thr({**FAST, "chunked_prefill_size": 1024})


def test_direct_swa_kv_saves_the_page_split_of_flashinfer_only() -> None:
    fi = {**FAST, "sm120_flashmla_backend": "flashinfer"}
    with_split = pm.decode_step_seconds(config_from_levers(fi, mode="decode"), 16)
    direct = pm.decode_step_seconds(
        config_from_levers({**fi, "sm120_direct_swa_kv": True}, mode="decode"), 16
    )
    assert direct < with_split
    for backend in ("triton", "torch"):  # a no-op there: the lever is inactive in the space
        lv = {**FAST, "sm120_flashmla_backend": backend, "chunked_prefill_size": 1024}
        assert pd_thr(lv, env={"SGLANG_OPT_SM120_DIRECT_SWA_KV": "1"}) == pd_thr(lv)


def test_mtp_verifier_memory_halves_the_effective_batch() -> None:
    spec = config_from_levers(BASELINE, mode="decode")
    nospec = config_from_levers(
        {**BASELINE, "speculative": "off", "max_running_requests": 128}, mode="decode"
    )
    assert pm.running_cap(spec) == 12
    assert pm.running_cap(spec) <= 0.5 * pm.running_cap(nospec)


def test_best_joint_setting(optimum: Optimum) -> None:
    assert 1000 <= optimum.throughput <= 1300
    assert optimum.throughput >= 25 * thr(BASELINE)  # the bar for the main job
    pre, dec = pd_configs(optimum.levers)
    assert not pm.serves_wrong_text(dec)
    assert not violations(optimum.levers)
    assert thr(optimum.levers) == pytest.approx(optimum.throughput)
    assert len(optimum.changed) >= 4
    assert 10 <= optimum.tpot_ms <= 20
    assert optimum.levers["sm120_flashmla_backend"] == "flashinfer"
    assert optimum.levers["disable_overlap_schedule"] is False


def test_optimum_search_is_fast() -> None:
    import time

    t0 = time.perf_counter()
    found = true_optimum(concurrency=16, input_len=256, output_len=128)
    assert time.perf_counter() - t0 < 20
    assert found.throughput > 0 and found.evaluated > 1000


def test_no_two_lever_change_from_baseline_comes_close(optimum: Optimum) -> None:
    domains: dict[str, list[object]] = {k: list(v) for k, v in CATEGORIES.items()}
    del domains["nccl_channels"]  # only meaningful with its two counts: see below
    domains |= {
        "nccl_min_nchannels": [
            {"nccl_channels": True, "nccl_min_nchannels": c, "nccl_max_nchannels": c}
            for c in (1, 4, 16)
        ],
        "speculative_num_steps": [1, 2, 4],
        "mem_fraction_static": [0.7, 0.8, 0.9, 0.95],
        "cuda_graph_max_bs_decode": [16, 32, 256],
        "max_running_requests": [8, 16, 128],
        "chunked_prefill_size": [2048, 16384],
    }
    best = 0.0
    for a, b in itertools.combinations(domains, 2):
        for va, vb in itertools.product(domains[a], domains[b]):
            levers: dict[str, object] = {**BASELINE}
            for name, value in ((a, va), (b, vb)):
                levers |= value if isinstance(value, dict) else {name: value}
            if violations(levers):
                continue
            if pm.serves_wrong_text(config_from_levers(levers, mode="decode")):
                continue
            best = max(best, thr(levers))
    assert best < 0.5 * optimum.throughput


def test_few_random_settings_come_close(optimum: Optimum) -> None:
    rng = random.Random(2024)
    n, near, moderate, ok = 20000, 0, 0, 0
    best = 0.0
    for _ in range(n):
        levers = sample_levers(rng)
        value = thr(levers)
        if value <= 0:
            continue
        ok += 1
        moderate += 40 <= value <= 600
        if pm.serves_wrong_text(config_from_levers(levers, mode="decode")):
            continue
        best = max(best, value)
        if value >= 0.95 * optimum.throughput:
            near += 1
            assert len(changed_levers(levers)) >= 4
    assert best <= optimum.throughput * (1 + 1e-9)  # the search is exact
    assert near / n < 0.01
    assert moderate / ok > 0.6  # most trials are neither absurdly slow nor near-optimal
    # start-up failures exist but are not the norm (a third of them: the torch attention
    # path's prefill OOM, which a uniform draw hits often)
    assert ok / n > 0.6


def test_wrong_text_config_is_fast_enough_to_fool_an_ungated_tuner(optimum: Optimum) -> None:
    wrong = {**optimum.levers, "pcie_ipc_allreduce": False, "nccl_proto": "LL128"}
    assert pm.serves_wrong_text(config_from_levers(wrong, mode="decode"))
    assert thr(wrong) > optimum.throughput


def test_exactly_one_combination_serves_wrong_text() -> None:
    for proto, ipc in itertools.product(CATEGORIES["nccl_proto"], (False, True)):
        levers = {**BASELINE, "nccl_proto": proto, "pcie_ipc_allreduce": ipc}
        dec = config_from_levers(levers, mode="decode")
        assert pm.serves_wrong_text(dec) == (proto == "LL128" and not ipc)
        custom_off = served(levers, "decode", ["--disable-custom-all-reduce"])
        assert pm.serves_wrong_text(custom_off) == pm.serves_wrong_text(dec)
    cfg = parse_config(["--model-path", "/m", "--tp-size", "4"], {"NCCL_PROTO": "^LL128"})
    assert not pm.serves_wrong_text(cfg)
    cfg = parse_config(["--model-path", "/m", "--tp-size", "4"], {"NCCL_PROTO": "LL,LL128"})
    assert pm.serves_wrong_text(cfg)


# ---- levers that do nothing for this model on this hardware --------------------------
NOOPS: list[tuple[str, Sequence[str], Mapping[str, str]]] = [
    # custom_all_reduce.py: world size 2 or full NVLink; TP4 over PCIe never engages
    ("--disable-custom-all-reduce", ["--disable-custom-all-reduce"], {}),
    # DeepSeek-V4 forces attention_backend=dsv4: the Triton-attention split knobs are unread
    ("--triton-attention-num-kv-splits", ["--triton-attention-num-kv-splits", "2"], {}),
    ("STATIC_KV_SPLITS", [], {"SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS": "true"}),
    (
        "both split knobs",
        ["--triton-attention-num-kv-splits", "32"],
        {"SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS": "1"},
    ),
    # SM120's MXFP8 x MXFP4 path already computes in FP8 (mxfp4_flashinfer_cutlass_moe.py)
    ("--flashinfer-mxfp4-moe-precision bf16", ["--flashinfer-mxfp4-moe-precision", "bf16"], {}),
    ("--flashinfer-mxfp4-moe-precision fp8", ["--flashinfer-mxfp4-moe-precision", "fp8"], {}),
    # sparse FlashMLA prefill is off on sm_120 (deepseek_v4_backend.py _use_sparse_prefill)
    ("--dsv4-prefill-backend", ["--dsv4-prefill-backend", "flashmla_sparse_q8"], {}),
    # DeepSeek-V4 resolves auto to fp8_e4m3 (overrides.py _deepseek_v4_kv_cache_dtype)
    ("--kv-cache-dtype fp8_e4m3", ["--kv-cache-dtype", "fp8_e4m3"], {}),
    # the page size and attention backend are forced
    ("--page-size / --attention-backend", ["--page-size", "64", "--attention-backend", "fa3"], {}),
]


@pytest.mark.parametrize(("name", "extra", "env"), NOOPS, ids=[n for n, _, _ in NOOPS])
@pytest.mark.parametrize(
    "levers",
    [
        BASELINE,
        FAST,
        {
            **BASELINE,
            "moe_runner_backend": "flashinfer_mxfp4",
            "sm120_flashmla_backend": "torch",
            "chunked_prefill_size": 1024,
            "cuda_graph_backend_decode": "disabled",
        },
    ],
    ids=["baseline", "fast", "mxfp4-torch-eager"],
)
def test_noop_levers_change_nothing(
    name: str, extra: Sequence[str], env: Mapping[str, str], levers: Mapping[str, object]
) -> None:
    plain_pre, plain_dec = served(levers, "prefill"), served(levers, "decode")
    pre, dec = served(levers, "prefill", extra, env), served(levers, "decode", extra, env)
    assert pd_thr(levers, extra, env) == pd_thr(levers) > 0
    for batch in (1, 8, 16):
        assert pm.decode_step_seconds(dec, batch) == pm.decode_step_seconds(plain_dec, batch)
    assert pm.prefill_seconds(pre, IN) == pm.prefill_seconds(plain_pre, IN)
    assert pm.kv_slots(dec) == pm.kv_slots(plain_dec)
    assert pm.nonstatic_need_bytes(dec) == pm.nonstatic_need_bytes(plain_dec)
    assert pm.startup_failure(dec) == pm.startup_failure(plain_dec)
    assert pm.serves_wrong_text(dec) == pm.serves_wrong_text(plain_dec)


def test_custom_all_reduce_engages_only_at_tp2() -> None:
    tp2 = parse_config(["--model-path", "/m", "--tp-size", "2"], {})
    tp4 = parse_config(["--model-path", "/m", "--tp-size", "4"], {})
    assert pm.allreduce_path(tp2) == "custom"
    assert pm.allreduce_path(tp4) == "nccl"
    off = parse_config(["--model-path", "/m", "--tp-size", "2", "--disable-custom-all-reduce"], {})
    assert pm.allreduce_path(off) == "nccl"


def test_kv_cache_dtypes_other_than_fp8_do_not_start() -> None:
    bf16 = served(BASELINE, "decode", ["--kv-cache-dtype", "bfloat16"])
    failure = pm.startup_failure(bf16)
    assert failure is not None and failure.after_load
    assert "assert self.store_dtype == torch.uint8" in "\n".join(failure.lines)
    fp8_e5m2 = served(BASELINE, "decode", ["--kv-cache-dtype", "fp8_e5m2"])
    failure = pm.startup_failure(fp8_e5m2)
    assert failure is not None and not failure.after_load
    assert "fp8_e5m2 is not supported for DeepseekV4ForCausalLM" in failure.lines[-1]
    assert pm.resolve(served(BASELINE, "decode"))["kv_cache_dtype"] == "fp8_e4m3"


# ---- resolution: silent rewrites ----------------------------------------------------------
def test_resolve_uses_server_args_field_names() -> None:
    dests = {o.dest for o in load_manifest("sglang", "0.5.23").options}
    for mode in ("prefill", "decode", "null"):
        info = pm.resolve(served(BASELINE, mode))
        assert set(info) <= dests, set(info) - dests


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
            "--cuda-graph-max-bs-decode",
            "24",
            "--disaggregation-mode",
            "decode",
        ],
        {},
    )
    info = pm.resolve(cfg)
    assert info["disable_custom_all_reduce"] is False  # 0.5.23 keeps the flag, ignores it
    assert info["speculative_algorithm"] == "EAGLE"
    assert info["speculative_num_draft_tokens"] == 3  # topk 1 forces steps + 1
    assert info["page_size"] == 256 and info["attention_backend"] == "dsv4"
    assert info["cuda_graph_max_bs_decode"] == 24 and info["cuda_graph_backend_decode"] == "full"
    assert info["cuda_graph_bs_decode"] == [*range(1, 9), *range(10, 25, 2)]  # spec list
    assert info["cuda_graph_config"]["decode"]["max_bs"] == 24  # type: ignore[index]
    assert info["disable_radix_cache"] is True and info["kv_cache_dtype"] == "fp8_e4m3"
    assert info["quantization"] == "mxfp4" and info["moe_runner_backend"] == "flashinfer_mxfp4"
    assert info["max_running_requests"] == min(48, pm.kv_slots(cfg))  # spec default 48
    rewrites = "\n".join(pm.silent_rewrites(cfg))
    assert "NEXTN -> EAGLE" in rewrites and "custom all-reduce not used" in rewrites
    assert "kv_cache_dtype: auto -> fp8_e4m3" in rewrites


def test_graph_list_sets_the_max_and_pads() -> None:
    listed = config_from_levers({**FAST, "cuda_graph_bs_decode": "pow2-16"}, mode="decode")
    assert pm.resolve(listed)["cuda_graph_max_bs_decode"] == 16
    assert pm.padded_batch(listed, 12) == 16 and pm.padded_batch(listed, 16) == 16
    dense = config_from_levers({**FAST, "cuda_graph_bs_decode": "all-16"}, mode="decode")
    assert pm.padded_batch(dense, 12) == 12
    assert pm.decode_step_seconds(dense, 12) < pm.decode_step_seconds(listed, 12)
    assert pm.decode_step_seconds(dense, 16) == pm.decode_step_seconds(listed, 16)
    assert not pm.uses_cuda_graph(listed, 17)
    default = parse_config(
        ["--model-path", "/m", "--tp-size", "4", "--max-running-requests", "64"], {}
    )
    assert pm.resolve(default)["cuda_graph_max_bs_decode"] == 64  # 512 capped by the limit


def test_graph_backends_order_the_launch_cost() -> None:
    steps = {
        backend: pm.decode_step_breakdown(
            config_from_levers({**FAST, "cuda_graph_backend_decode": backend}, mode="decode"), 16
        )["launch"]
        for backend in CATEGORIES["cuda_graph_backend_decode"]
    }
    assert steps["full"] < steps["breakable"] < steps["disabled"]
    # cuda_graph_hook.py: the deprecated switch disables both phases; an explicit
    # --cuda-graph-backend-decode wins over it
    base = ["--model-path", "/m", "--tp-size", "4", "--disaggregation-mode", "decode"]
    deprecated = parse_config([*base, "--disable-cuda-graph"], {})
    explicit = parse_config([*base, "--cuda-graph-backend-decode", "disabled"], {})
    assert not pm.uses_cuda_graph(deprecated, 1) and not pm.uses_cuda_graph(explicit, 1)
    assert pm.decode_step_seconds(deprecated, 16) == pm.decode_step_seconds(explicit, 16)
    both = parse_config([*base, "--disable-cuda-graph", "--cuda-graph-backend-decode", "full"], {})
    assert pm.uses_cuda_graph(both, 1)


def test_disabling_the_overlap_scheduler_only_costs() -> None:
    on = config_from_levers(FAST, mode="decode")
    off = config_from_levers({**FAST, "disable_overlap_schedule": True}, mode="decode")
    for batch in (1, 16):
        assert pm.decode_step_seconds(off, batch) > pm.decode_step_seconds(on, batch)
    assert thr({**FAST, "disable_overlap_schedule": True}) < thr(FAST)


def test_speculation_on_prefill_seeds_the_decode_drafts() -> None:
    decode_only = {**NVFP4, "sm120_flashmla_backend": "flashinfer", "speculative_num_steps": 1}
    both = {**decode_only, "prefill_speculative": True}
    pre_off, dec = pd_configs(decode_only)
    pre_on, dec_same = pd_configs(both)
    assert dec == dec_same  # only the prefill server's flags differ
    assert pm.accept_length(dec, seeded=True) > pm.accept_length(dec, seeded=False)
    assert pm.accept_length(dec) == pm.accept_length(dec, seeded=False)  # a PD decode alone
    assert pm.prefill_seconds(pre_on, IN) > pm.prefill_seconds(pre_off, IN)
    assert thr(both) > thr(decode_only)
    null = config_from_levers(decode_only)  # a null server prefills its own drafts
    assert pm.accept_length(null) == pm.accept_length(dec, seeded=True)


def test_pcie_ipc_serves_decode_sizes_and_leaves_prefill_chunks_to_nccl() -> None:
    dec = config_from_levers(FAST, mode="decode")  # graphs up to 16, no spec: 16 rows
    assert pm.allreduce_path(dec, 16 * pm.HIDDEN * 2) == "pcie_ipc"
    assert pm.allreduce_path(dec, 17 * pm.HIDDEN * 2) == "nccl"
    pre = config_from_levers(FAST, mode="prefill")
    assert pm.allreduce_path(pre, 1024 * pm.HIDDEN * 2) == "nccl"
    wide = served(FAST, "prefill", env={"SGLANG_PCIE_IPC_MAX_NUMEL": str(2048 * pm.HIDDEN)})
    assert pm.allreduce_path(wide, 1024 * pm.HIDDEN * 2) == "pcie_ipc"


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
    for algo in ("EAGLE3", "STANDALONE", "NGRAM"):
        cfg = parse_config(["--model-path", "/m", "--speculative-algorithm", algo], {})
        failure = pm.startup_failure(cfg)
        assert failure is not None and "Only EAGLE and DSPARK" in failure.lines[-1]


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


# ---- structural properties ----------------------------------------------------------------
def dec(*parts: dict[str, object], **levers: object) -> SimConfig:
    merged: dict[str, object] = {**BASELINE}
    for part in parts:
        merged |= part
    return config_from_levers({**merged, **levers}, mode="decode")


def test_component_levers_move_the_right_component() -> None:
    base = pm.decode_step_breakdown(dec(FAST, pcie_ipc_allreduce=False), 16)
    ipc = pm.decode_step_breakdown(dec(FAST), 16)
    ll = pm.decode_step_breakdown(dec(FAST, pcie_ipc_allreduce=False, nccl_proto="LL"), 16)
    assert ipc["allreduce"] < ll["allreduce"] < base["allreduce"]
    triton = pm.decode_step_breakdown(dec(FAST, sm120_flashmla_backend="triton"), 16)
    assert base["attention"] < triton["attention"] / 10
    eager = pm.decode_step_breakdown(dec(FAST, cuda_graph_max_bs_decode=8), 16)
    assert eager["launch"] > 10 * base["launch"]
    marlin = pm.decode_step_breakdown(
        dec(FAST, moe_runner_backend="marlin", checkpoint="mxfp4"), 16
    )
    assert marlin["moe_and_dense"] > 5 * base["moe_and_dense"]


def test_more_draft_tokens_touch_more_experts() -> None:
    assert pm.distinct_experts(1) == pytest.approx(6.0)
    # DOMAIN §7 quotes U(16)=80.5, U(64)=203 (rounded)
    assert pm.distinct_experts(16) == pytest.approx(80.5, abs=0.5)
    assert pm.distinct_experts(64) == pytest.approx(203, abs=4)
    fi = {**NVFP4, "sm120_flashmla_backend": "flashinfer"}
    steps = [pm.decode_step_seconds(dec(fi, speculative_num_steps=s), 16) for s in (1, 2, 3, 4)]
    assert steps == sorted(steps)
    lengths = [
        pm.accept_length(dec(fi, speculative_num_steps=s), seeded=True) for s in (1, 2, 3, 4)
    ]
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
    cfg = config_from_levers({**FAST, "sm120_direct_swa_kv": True})
    e = pm.expectation(cfg, concurrency=16, input_len=IN, output_len=OUT, deployment="decode")
    assert e.tpot_s == pytest.approx(e.step_s)
    assert e.output_throughput == pytest.approx(e.batch * OUT / ((OUT + 0.5) * e.step_s))
    assert e.batch == pytest.approx(16, rel=1e-3)
