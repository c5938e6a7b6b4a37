from __future__ import annotations

import random

import pytest

from autotune.errors import ConfigError
from autotune.sim.args import parse_config
from autotune.sim.levers import (
    BASELINE,
    config_from_levers,
    config_via_command,
    levers_to_command,
    sample_levers,
)


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
    assert cfg.cuda_graph_max_bs == 8 and cfg.max_running_requests == 48
    assert cfg.mem_fraction_static == 0.88
    assert cfg.disable_radix_cache and cfg.enable_metrics and cfg.trust_remote_code
    assert cfg.chunked_prefill_size is None  # prefill-only lever
    assert cfg.cuda_visible_devices == "4,5,6,7"
    assert not cfg.pcie_ipc_allreduce and not cfg.static_kv_splits


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
        "cutlass",
        "--quantization",
        "modelopt_fp4",
        "--mem-fraction-static",
        "0.8",
        "--disable-custom-all-reduce",
        "--cuda-graph-max-bs",
        "32",
        "--cuda-graph-max-bs-decode",
        "24",
        "--disable-cuda-graph",
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
        "--enable-metrics",
        "--disable-radix-cache",
        "--attention-backend",
        "triton",
        "--trust-remote-code",
        "--base-gpu-id",
        "4",
        "--log-level",
        "warning",
    ]
    env = {
        "NCCL_PROTO": "LL",
        "NCCL_ALGO": "Tree",
        "NCCL_MIN_NCHANNELS": "4",
        "NCCL_MAX_NCHANNELS": "8",
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS": "true",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "AUTOTUNE_SIM_LOAD_SECONDS": "1.5",
        "AUTOTUNE_SIM_NOISE": "0.1",
        "AUTOTUNE_SIM_SEED": "7",
    }
    cfg = parse_config(argv, env)
    assert (cfg.host, cfg.port, cfg.base_gpu_id, cfg.log_level) == ("0.0.0.0", 1234, 4, "warning")
    assert cfg.disaggregation_bootstrap_port == 9000
    assert cfg.cuda_graph_max_bs == 32 and cfg.cuda_graph_max_bs_decode == 24
    assert cfg.disable_cuda_graph and cfg.disable_custom_all_reduce
    assert cfg.page_size == 64 and cfg.attention_backend == "triton"
    assert cfg.speculative_algorithm == "NEXTN" and cfg.triton_attention_num_kv_splits == 16
    assert (cfg.nccl_proto, cfg.nccl_algo) == ("LL", "Tree")
    assert (cfg.nccl_min_nchannels, cfg.nccl_max_nchannels) == (4, 8)
    assert cfg.pcie_ipc_allreduce and cfg.static_kv_splits
    assert cfg.pytorch_cuda_alloc_conf == "expandable_segments:True"
    assert (cfg.sim_load_seconds, cfg.sim_noise, cfg.sim_seed) == (1.5, 0.1, 7)


def test_env_defaults_and_false_values() -> None:
    env = {
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "0",
        "SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS": "false",
        "NCCL_MIN_NCHANNELS": "x",
    }
    cfg = parse_config(["--model-path", "/m"], env)
    assert not cfg.pcie_ipc_allreduce and not cfg.static_kv_splits
    assert cfg.nccl_min_nchannels is None and cfg.nccl_proto is None
    assert (cfg.sim_load_seconds, cfg.sim_noise, cfg.sim_seed) == (0.3, 0.03, None)


@pytest.mark.parametrize(
    "argv",
    [
        ["--model-path", "/m", "--no-such-flag"],
        ["--model-path", "/m", "--tp", "4"],  # abbreviations are errors, as in SGLang
        ["--model-path", "/m", "--disaggregation-mode", "both"],
        ["--model-path", "/m", "--speculative-algorithm", "MTP"],
        ["--model-path", "/m", "--mem-fraction-static", "lots"],
        ["--tp-size", "4"],
    ],
)
def test_bad_flags_exit_2_like_argparse(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_config(argv, {})
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


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
        "cuda_graph": False,
        "custom_all_reduce": False,
        "nccl_proto": "unset",
        "nccl_channels": True,
        "nccl_min_nchannels": 2,
        "nccl_max_nchannels": 4,
        "checkpoint": "nvfp4",
        "moe_runner_backend": "flashinfer_cutlass",
    }
    argv, env = levers_to_command(levers, mode="decode")
    assert "--speculative-algorithm" not in argv and "--disable-radix-cache" not in argv
    assert "--disable-cuda-graph" in argv and "--cuda-graph-max-bs" not in argv
    assert "--disable-custom-all-reduce" in argv
    assert argv[argv.index("--model-path") + 1] == "/models/DeepSeek-V4-Flash-NVFP4"
    assert argv[argv.index("--quantization") + 1] == "modelopt_fp4"
    assert "NCCL_PROTO" not in env
    assert (env["NCCL_MIN_NCHANNELS"], env["NCCL_MAX_NCHANNELS"]) == ("2", "4")
    pre_argv, _ = levers_to_command(levers, mode="prefill")
    assert "--chunked-prefill-size" in pre_argv and "--disable-cuda-graph" not in pre_argv


def test_unknown_lever_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="nccl_buffsize"):
        config_from_levers({"nccl_buffsize": 4})
