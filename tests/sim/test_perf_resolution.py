"""How the performance model resolves a command, as SGLang does (server-args field names,
silent rewrites, speculative defaults), and what the resolved settings cost: CUDA-graph lists
and backends, the overlap scheduler, drafts seeded by the prefill, PCIe IPC against NCCL.
Split from test_perf_model.py."""

from __future__ import annotations

from autotune.engines._manifest import load_manifest
from autotune.sim import perf_model as pm
from autotune.sim.args import parse_config
from autotune.sim.levers import (
    BASELINE,
    CATEGORIES,
    config_from_levers,
    pd_configs,
)

from .perf_helpers import FAST, IN, NVFP4, served, thr


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
