from __future__ import annotations

import random
import time

import pytest

from autotune.engines._manifest import load_manifest
from autotune.errors import ConfigError
from autotune.sim.args import build_parser, parse_config
from autotune.sim.levers import (
    BASELINE,
    config_from_levers,
    config_via_command,
    levers_to_command,
    sample_levers,
)

MANIFEST = load_manifest("sglang", "0.5.23")


def test_baseline_decode_command_parses_every_flag() -> None:
    argv, env = levers_to_command(BASELINE, mode="decode", port=30001)
    cfg = parse_config(argv, env)
    assert cfg.model_path == "/models/DeepSeek-V4-Flash"
    assert cfg.quantization == "mxfp4"
    assert cfg.tp_size == 4 and cfg.port == 30001
    assert cfg.disaggregation_mode == "decode"
    assert cfg.disaggregation_transfer_backend == "nixl"
    assert cfg.moe_runner_backend == "marlin"
    assert cfg.speculative_algorithm == "EAGLE" and cfg.speculative_num_steps == 3
    assert cfg.speculative_num_draft_tokens == 4 and cfg.speculative_eagle_topk == 1
    assert cfg.cuda_graph_max_bs_decode == 8 and cfg.max_running_requests == 48
    assert cfg.cuda_graph_backend_decode == "full" and cfg.cuda_graph_bs_decode is None
    assert cfg.mem_fraction_static == 0.88
    assert cfg.disable_radix_cache and cfg.enable_metrics and cfg.trust_remote_code
    assert cfg.chunked_prefill_size is None  # prefill-only lever
    assert cfg.cuda_visible_devices == "4,5,6,7"
    assert cfg.sm120_flashmla_backend == "triton"  # the seeds' 63% kernel
    assert not cfg.pcie_ipc_allreduce and not cfg.disable_overlap_schedule
    prefill = parse_config(*levers_to_command(BASELINE, mode="prefill"))
    assert prefill.speculative_algorithm is None  # decode-only speculation, as today
    assert prefill.chunked_prefill_size == 8192


def test_removed_cuda_graph_max_bs_is_ambiguous(capsys: pytest.CaptureFixture[str]) -> None:
    """0.5.20 split --cuda-graph-max-bs into -decode/-prefill: with argparse's prefix
    matching the old spelling is now ambiguous, exit 2 (DOMAIN.md §2)."""
    assert MANIFEST.resolve("--cuda-graph-max-bs").status == "ambiguous"
    with pytest.raises(SystemExit) as exc:
        parse_config(["--model-path", "/m", "--cuda-graph-max-bs", "8"], {})
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "ambiguous option: --cuda-graph-max-bs could match" in err
    assert "--cuda-graph-max-bs-decode" in err and "--cuda-graph-max-bs-prefill" in err


def test_prefix_matching_like_the_real_parser() -> None:
    cfg = parse_config(["--model-path", "/m", "--tp", "4", "--mem-fraction", "0.8"], {})
    assert cfg.tp_size == 4 and cfg.mem_fraction_static == 0.8
    assert MANIFEST.resolve("--tp").status == "abbreviation"


def test_parser_has_every_manifest_option() -> None:
    parser = build_parser()
    strings = set(parser._option_string_actions)
    for option in MANIFEST.options:
        assert set(option.flags) <= strings, option.flags
        action = parser._option_string_actions[option.flags[0]]
        assert action.dest == option.dest
        if option.multi_value:
            assert action.nargs == option.nargs, option.flags
        if option.choices is not None and option.takes_value:
            assert {str(c) for c in action.choices or ()} == {str(c) for c in option.choices}


def test_parser_is_built_once_and_fast() -> None:
    build_parser.cache_clear()
    t0 = time.perf_counter()
    first = build_parser()
    built = time.perf_counter() - t0
    assert build_parser() is first
    t0 = time.perf_counter()
    parse_config(*levers_to_command(BASELINE, mode="decode"))
    parsed = time.perf_counter() - t0
    assert built < 1.0 and parsed < 0.05, (built, parsed)


def test_every_contract_flag_and_variable_exists_in_0_5_23() -> None:
    rng = random.Random(5)
    for _ in range(200):
        levers = sample_levers(rng)
        for mode in ("prefill", "decode", "null"):
            argv, env = levers_to_command(levers, mode=mode)
            for token in argv:
                if token.startswith("--"):
                    resolution = MANIFEST.resolve(token)
                    assert resolution.status == "exact", token
                    assert resolution.option is not None and not resolution.option.deprecated
            for name in env:
                if name.startswith("SGLANG_"):
                    assert MANIFEST.env_names is not None and name in MANIFEST.env_names


def test_all_listed_flags_and_env() -> None:
    argv = [
        "--model-path",
        "/m",
        "--served-model-name",
        "x",
        "--tp-size",
        "4",
        "--host",
        "0.0.0.0",
        "--port",
        "1234",
        "--disaggregation-mode",
        "prefill",
        "--disaggregation-bootstrap-port",
        "9000",
        "--disaggregation-transfer-backend",
        "nixl",
        "--moe-runner-backend",
        "flashinfer_cutedsl",
        "--flashinfer-mxfp4-moe-precision",
        "bf16",
        "--quantization",
        "modelopt_fp4",
        "--kv-cache-dtype",
        "fp8_e4m3",
        "--mem-fraction-static",
        "0.8",
        "--disable-custom-all-reduce",
        "--cuda-graph-max-bs-decode",
        "24",
        "--cuda-graph-bs-decode",
        "1",
        "2",
        "4",
        "--cuda-graph-backend-decode",
        "breakable",
        "--disable-cuda-graph",
        "--disable-overlap-schedule",
        "--max-running-requests",
        "64",
        "--chunked-prefill-size",
        "4096",
        "--page-size",
        "64",
        "--speculative-algorithm",
        "NEXTN",
        "--speculative-num-steps",
        "2",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "3",
        "--triton-attention-num-kv-splits",
        "16",
        "--dsv4-prefill-backend",
        "flashmla_sparse",
        "--enable-metrics",
        "--disable-radix-cache",
        "--attention-backend",
        "triton",
        "--trust-remote-code",
        "--base-gpu-id",
        "4",
        "--log-level",
        "warning",
        "--context-length",
        "128k",
    ]
    env = {
        "NCCL_PROTO": "LL",
        "NCCL_ALGO": "Tree",
        "NCCL_MIN_NCHANNELS": "4",
        "NCCL_MAX_NCHANNELS": "8",
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1",
        "SGLANG_PCIE_IPC_MAX_NUMEL": "1048576",
        "SGLANG_SM120_FLASHMLA_BACKEND": "torch",
        "SGLANG_OPT_SM120_DIRECT_SWA_KV": "true",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS": "true",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "AUTOTUNE_SIM_LOAD_SECONDS": "1.5",
        "AUTOTUNE_SIM_NOISE": "0.1",
        "AUTOTUNE_SIM_SEED": "7",
    }
    cfg = parse_config(argv, env)
    assert (cfg.host, cfg.port, cfg.base_gpu_id, cfg.log_level) == ("0.0.0.0", 1234, 4, "warning")
    assert cfg.disaggregation_bootstrap_port == 9000 and cfg.context_length == 128000
    assert cfg.moe_runner_backend == "flashinfer_cutedsl"
    assert cfg.flashinfer_mxfp4_moe_precision == "bf16" and cfg.kv_cache_dtype == "fp8_e4m3"
    assert cfg.cuda_graph_max_bs_decode == 24 and cfg.cuda_graph_bs_decode == (1, 2, 4)
    assert cfg.cuda_graph_backend_decode == "breakable"
    assert cfg.disable_cuda_graph and cfg.disable_custom_all_reduce
    assert cfg.disable_overlap_schedule
    assert cfg.page_size == 64 and cfg.attention_backend == "triton"
    assert cfg.speculative_algorithm == "NEXTN" and cfg.triton_attention_num_kv_splits == 16
    assert cfg.dsv4_prefill_backend == "flashmla_sparse"
    assert (cfg.nccl_proto, cfg.nccl_algo) == ("LL", "Tree")
    assert (cfg.nccl_min_nchannels, cfg.nccl_max_nchannels) == (4, 8)
    assert cfg.pcie_ipc_allreduce and cfg.pcie_ipc_max_numel == 1048576
    assert cfg.sm120_flashmla_backend == "torch" and cfg.sm120_direct_swa_kv
    assert cfg.static_kv_splits
    assert cfg.pytorch_cuda_alloc_conf == "expandable_segments:True"
    assert (cfg.sim_load_seconds, cfg.sim_noise, cfg.sim_seed) == (1.5, 0.1, 7)


def test_env_defaults_and_false_values() -> None:
    env = {
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "0",
        "SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS": "false",
        "SGLANG_OPT_SM120_DIRECT_SWA_KV": "0",
        "NCCL_MIN_NCHANNELS": "x",
    }
    cfg = parse_config(["--model-path", "/m"], env)
    assert not cfg.pcie_ipc_allreduce and not cfg.static_kv_splits
    assert not cfg.sm120_direct_swa_kv
    assert cfg.sm120_flashmla_backend == "flashinfer"  # 0.5.23's default (srt/environ.py)
    assert cfg.nccl_min_nchannels is None and cfg.nccl_proto is None
    assert (cfg.sim_load_seconds, cfg.sim_noise, cfg.sim_seed) == (0.3, 0.03, None)
    assert cfg.cuda_graph_backend_decode is None and cfg.kv_cache_dtype == "auto"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--model-path", "/m", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--model-path", "/m", "--cuda-graph-max-bs", "8"], "ambiguous option"),
        (["--model-path", "/m", "--speculative-num", "2"], "ambiguous option"),
        (["--model-path", "/m", "--disaggregation-mode", "both"], "invalid choice: 'both'"),
        (["--model-path", "/m", "--cuda-graph-backend-decode", "tc_piecewise"], "removed"),
        (["--model-path", "/m", "--cuda-graph-bs-decode"], "expected at least one argument"),
        (["--model-path", "/m", "--kv-cache-dtype", "int8"], "invalid choice"),
        (["--model-path", "/m", "--mem-fraction-static", "lots"], "invalid float value"),
        (["--tp-size", "4"], "required: --model-path"),
    ],
)
def test_bad_flags_exit_2_like_argparse(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_config(argv, {})
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and needle in err


@pytest.mark.parametrize("mode", ["null", "prefill", "decode"])
def test_levers_rendered_to_command_parse_to_the_same_config(mode: str) -> None:
    rng = random.Random(11)
    for _ in range(150):
        levers = sample_levers(rng)
        assert config_via_command(levers, mode=mode) == config_from_levers(levers, mode=mode)
    assert config_via_command(BASELINE, mode=mode) == config_from_levers(BASELINE, mode=mode)


def test_contract_rendering_details() -> None:
    levers = {
        **BASELINE,
        "speculative": "off",
        "cuda_graph_backend_decode": "disabled",
        "nccl_proto": "unset",
        "nccl_channels": True,
        "nccl_min_nchannels": 2,
        "nccl_max_nchannels": 4,
        "checkpoint": "nvfp4",
        "moe_runner_backend": "flashinfer_cutlass",
        "sm120_flashmla_backend": "flashinfer",
        "sm120_direct_swa_kv": True,
        "disable_overlap_schedule": True,
    }
    argv, env = levers_to_command(levers, mode="decode")
    assert "--speculative-algorithm" not in argv and "--disable-radix-cache" not in argv
    assert argv[argv.index("--cuda-graph-backend-decode") + 1] == "disabled"
    assert "--cuda-graph-max-bs-decode" not in argv and "--disable-cuda-graph" not in argv
    assert "--disable-custom-all-reduce" not in argv  # not a lever: a no-op at TP4
    assert "--disable-overlap-schedule" in argv
    assert argv[argv.index("--model-path") + 1] == "/models/DeepSeek-V4-Flash-NVFP4"
    assert argv[argv.index("--quantization") + 1] == "modelopt_fp4"
    assert "NCCL_PROTO" not in env
    assert (env["NCCL_MIN_NCHANNELS"], env["NCCL_MAX_NCHANNELS"]) == ("2", "4")
    assert env["SGLANG_SM120_FLASHMLA_BACKEND"] == "flashinfer"
    assert env["SGLANG_OPT_SM120_DIRECT_SWA_KV"] == "1"
    assert "SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS" not in env
    pre_argv, _ = levers_to_command(levers, mode="prefill")
    assert "--chunked-prefill-size" in pre_argv and "--cuda-graph-backend-decode" not in pre_argv
    listed = {**BASELINE, "cuda_graph_bs_decode": "pow2-16"}
    argv, _ = levers_to_command(listed, mode="decode")
    i = argv.index("--cuda-graph-bs-decode")
    assert argv[i + 1 : i + 6] == ["1", "2", "4", "8", "16"]
    assert "--cuda-graph-max-bs-decode" not in argv  # the list sets the max
    assert parse_config(argv, {}).cuda_graph_bs_decode == (1, 2, 4, 8, 16)
    both = {**BASELINE, "prefill_speculative": True, "speculative_num_steps": 2}
    pre_argv, _ = levers_to_command(both, mode="prefill")
    for flag, value in (
        ("--speculative-algorithm", "EAGLE"),
        ("--speculative-num-steps", "2"),
        ("--speculative-num-draft-tokens", "3"),
    ):
        assert pre_argv[pre_argv.index(flag) + 1] == value


def test_unknown_lever_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="nccl_buffsize"):
        config_from_levers({"nccl_buffsize": 4})
    for removed in ("custom_all_reduce", "triton_attention_num_kv_splits", "cuda_graph_max_bs"):
        with pytest.raises(ConfigError, match=removed):
            config_from_levers({removed: 1})
