"""The bundled DeepSeek-V4-Flash space encodes the lever table, constraints and baseline."""

from __future__ import annotations

import math
import random

import pytest
from space_fixtures import BUNDLED, VLLM

from autotune.errors import ConfigError
from autotune.space import (
    SearchSpace,
    ServiceSettings,
    TrialConfig,
    Value,
    Violation,
    check_space,
    load_space,
)

NCCL_ENV = {"NCCL_PROTO", "NCCL_ALGO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS"}


@pytest.fixture(scope="module")
def space() -> SearchSpace:
    return load_space(BUNDLED)


def _with(space: SearchSpace, **changes: Value) -> TrialConfig:
    params = space.baseline_params()
    params.update(changes)
    return space.complete(params)


def test_parameters_are_the_lever_table(space: SearchSpace) -> None:
    assert [p.name for p in space.params] == [
        "nccl_proto",
        "nccl_algo",
        "nccl_channels",
        "nccl_min_nchannels",
        "nccl_max_nchannels",
        "custom_all_reduce",
        "pcie_ipc_allreduce",
        "moe_runner_backend",
        "checkpoint",
        "speculative",
        "speculative_num_steps",
        "speculative_num_draft_tokens",
        "mem_fraction_static",
        "cuda_graph",
        "cuda_graph_max_bs",
        "max_running_requests",
        "chunked_prefill_size",
        "pytorch_alloc_conf",
        "triton_attention_num_kv_splits",
        "static_kv_splits",
    ]
    p = space.parameter
    assert p("nccl_proto").choices == ("unset", "LL", "LL128", "Simple")
    assert p("nccl_algo").choices == ("unset", "Ring", "Tree")
    assert p("moe_runner_backend").choices == (
        "marlin",
        "triton",
        "cutlass",
        "flashinfer_mxfp4",
        "flashinfer_cutlass",
    )
    assert p("checkpoint").choices == ("mxfp4", "nvfp4")
    assert p("speculative").choices == ("off", "eagle")
    assert p("pytorch_alloc_conf").choices == ("unset", "expandable_segments:True")
    assert p("triton_attention_num_kv_splits").choices == (1, 2, 4, 8, 16, 32, 64)
    assert p("nccl_min_nchannels").domain_text() == "1..32 (log)"
    assert p("nccl_max_nchannels").domain_text() == "1..32 (log)"
    assert p("speculative_num_steps").domain_text() == "1..4"
    assert p("mem_fraction_static").domain_text() == "0.7..0.95 step 0.01"
    assert p("cuda_graph_max_bs").domain_text() == "8..256 step 8"
    assert p("max_running_requests").domain_text() == "8..128 step 8"
    assert p("chunked_prefill_size").domain_text() == "1024..16384 step 1024"
    decode_only = {
        "speculative",
        "speculative_num_steps",
        "speculative_num_draft_tokens",
        "cuda_graph",
        "cuda_graph_max_bs",
        "max_running_requests",
        "triton_attention_num_kv_splits",
        "static_kv_splits",
    }
    for param in space.params:
        if param.name in decode_only:
            assert param.services == ("decode",), param.name
        elif param.name == "chunked_prefill_size":
            assert param.services == ("prefill",)
        else:
            assert param.services == ("prefill", "decode"), param.name
    for param in space.params:
        assert "DOMAIN.md" in param.spec.description or param.name in {
            "speculative_num_draft_tokens",
        }, param.name


def test_baseline_is_exactly_todays_deployment(space: SearchSpace) -> None:
    assert space.baseline_config() == {
        "nccl_proto": "unset",
        "nccl_algo": "unset",
        "nccl_channels": False,
        "custom_all_reduce": True,
        "pcie_ipc_allreduce": False,
        "moe_runner_backend": "marlin",
        "checkpoint": "mxfp4",
        "speculative": "eagle",
        "speculative_num_steps": 3,
        "speculative_num_draft_tokens": 4,
        "mem_fraction_static": 0.88,
        "cuda_graph": True,
        "cuda_graph_max_bs": 8,
        "max_running_requests": 48,
        "chunked_prefill_size": 8192,
        "pytorch_alloc_conf": "unset",
        "triton_attention_num_kv_splits": 8,
        "static_kv_splits": False,
    }
    assert "speculative_num_draft_tokens" not in space.baseline_params()
    assert space.violations(space.baseline_config()) == []


def test_baseline_settings_decode(space: SearchSpace) -> None:
    settings = space.settings_for("decode", space.baseline_config())
    assert settings == ServiceSettings(
        flags={
            "--moe-runner-backend": "marlin",
            "--model-path": "/models/DeepSeek-V4-Flash",
            "--quantization": "mxfp4",
            "--speculative-algorithm": "EAGLE",
            "--speculative-eagle-topk": "1",
            "--disable-radix-cache": None,
            "--speculative-num-steps": "3",
            "--speculative-num-draft-tokens": "4",
            "--mem-fraction-static": "0.88",
            "--cuda-graph-max-bs": "8",
            "--max-running-requests": "48",
            "--triton-attention-num-kv-splits": "8",
        },
        remove_flags={"--disable-custom-all-reduce", "--disable-cuda-graph"},
        env={
            "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "0",
            "SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS": "false",
        },
        unset_env=NCCL_ENV | {"PYTORCH_CUDA_ALLOC_CONF"},
    )


def test_baseline_settings_prefill(space: SearchSpace) -> None:
    settings = space.settings_for("prefill", space.baseline_config())
    assert settings == ServiceSettings(
        flags={
            "--moe-runner-backend": "marlin",
            "--model-path": "/models/DeepSeek-V4-Flash",
            "--quantization": "mxfp4",
            "--mem-fraction-static": "0.88",
            "--chunked-prefill-size": "8192",
        },
        remove_flags={"--disable-custom-all-reduce"},
        env={"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "0"},
        unset_env=NCCL_ENV | {"PYTORCH_CUDA_ALLOC_CONF"},
    )


def test_service_outside_the_space_gets_nothing(space: SearchSpace) -> None:
    assert space.settings_for("router", space.baseline_config()) == ServiceSettings()


def test_switch_semantics(space: SearchSpace) -> None:
    config = _with(space, custom_all_reduce=False, cuda_graph=False)
    decode = space.settings_for("decode", config)
    assert decode.flags["--disable-custom-all-reduce"] is None
    assert decode.flags["--disable-cuda-graph"] is None
    # cuda_graph_max_bs is inactive without graphs: its flag is removed, not left stale.
    assert "cuda_graph_max_bs" not in config
    assert "--cuda-graph-max-bs" not in decode.flags
    assert "--cuda-graph-max-bs" in decode.remove_flags
    assert "--disable-custom-all-reduce" not in decode.remove_flags
    prefill = space.settings_for("prefill", config)
    assert prefill.flags["--disable-custom-all-reduce"] is None
    assert "--disable-cuda-graph" not in prefill.flags | dict.fromkeys(prefill.remove_flags)


def test_unset_and_env_semantics(space: SearchSpace) -> None:
    config = _with(
        space,
        nccl_proto="LL",
        nccl_algo="Tree",
        nccl_channels=True,
        nccl_min_nchannels=2,
        nccl_max_nchannels=16,
        pcie_ipc_allreduce=True,
        pytorch_alloc_conf="expandable_segments:True",
        static_kv_splits=True,
    )
    decode = space.settings_for("decode", config)
    assert decode.env == {
        "NCCL_PROTO": "LL",
        "NCCL_ALGO": "Tree",
        "NCCL_MIN_NCHANNELS": "2",
        "NCCL_MAX_NCHANNELS": "16",
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS": "true",
    }
    assert decode.unset_env == set()
    prefill = space.settings_for("prefill", config)
    assert "SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS" not in prefill.env
    assert prefill.env["NCCL_PROTO"] == "LL"


def test_map_semantics_checkpoint(space: SearchSpace) -> None:
    config = _with(space, checkpoint="nvfp4", moe_runner_backend="flashinfer_cutlass")
    for service in ("prefill", "decode"):
        settings = space.settings_for(service, config)
        assert settings.flags["--model-path"] == "/models/DeepSeek-V4-Flash-NVFP4"
        assert settings.flags["--quantization"] == "modelopt_fp4"
        assert settings.flags["--moe-runner-backend"] == "flashinfer_cutlass"
    assert space.violations(config) == []


def test_map_semantics_speculative_off_removes_everything(space: SearchSpace) -> None:
    params = space.baseline_params()
    params["speculative"] = "off"
    config = space.complete(params)  # steps given but inactive: dropped
    assert "speculative_num_steps" not in config
    assert "speculative_num_draft_tokens" not in config
    decode = space.settings_for("decode", config)
    speculative_flags = {
        "--speculative-algorithm",
        "--speculative-eagle-topk",
        "--disable-radix-cache",
        "--speculative-num-steps",
        "--speculative-num-draft-tokens",
    }
    assert not speculative_flags & set(decode.flags)
    assert speculative_flags <= decode.remove_flags
    prefill = space.settings_for("prefill", config)
    assert not speculative_flags & (set(prefill.flags) | prefill.remove_flags)


def test_derived_follows_steps(space: SearchSpace) -> None:
    for steps in range(1, 5):
        config = _with(space, speculative_num_steps=steps)
        assert config["speculative_num_draft_tokens"] == steps + 1
        flags = space.settings_for("decode", config).flags
        assert flags["--speculative-num-draft-tokens"] == str(steps + 1)


@pytest.mark.parametrize(
    ("changes", "rule"),
    [
        ({"moe_runner_backend": "flashinfer_cutlass"}, "flashinfer_cutlass_needs_nvfp4"),
        (
            {"moe_runner_backend": "flashinfer_mxfp4", "checkpoint": "nvfp4"},
            "flashinfer_mxfp4_needs_mxfp4",
        ),
        (
            {"nccl_channels": True, "nccl_min_nchannels": 8, "nccl_max_nchannels": 4},
            "nccl_min_above_max",
        ),
    ],
)
def test_forbidden_combinations(space: SearchSpace, changes: dict[str, Value], rule: str) -> None:
    violations = space.violations(_with(space, **changes))
    assert [v.name for v in violations] == [rule]
    assert isinstance(violations[0], Violation)
    assert "DOMAIN.md" in violations[0].reason
    assert str(violations[0]).startswith(rule + ": ")


def test_allowed_neighbours_of_forbidden(space: SearchSpace) -> None:
    ok: list[dict[str, Value]] = [
        {"moe_runner_backend": "flashinfer_mxfp4"},
        {"moe_runner_backend": "flashinfer_cutlass", "checkpoint": "nvfp4"},
        {"nccl_channels": True, "nccl_min_nchannels": 4, "nccl_max_nchannels": 4},
        {"moe_runner_backend": "cutlass", "checkpoint": "nvfp4"},
    ]
    for changes in ok:
        assert space.violations(_with(space, **changes)) == [], changes


def test_complete_normalises_and_validates(space: SearchSpace) -> None:
    config = _with(space, mem_fraction_static=0.7100000000000001)
    assert config["mem_fraction_static"] == 0.71
    assert space.settings_for("decode", config).flags["--mem-fraction-static"] == "0.71"
    params = space.baseline_params()
    del params["checkpoint"]
    with pytest.raises(ConfigError, match="missing a value for active parameter 'checkpoint'"):
        space.complete(params)
    with pytest.raises(ConfigError, match="unknown parameter 'bogus'") as info:
        space.complete({**space.baseline_params(), "bogus": 1})
    assert "nccl_proto" in (info.value.allowed or [])
    with pytest.raises(ConfigError, match="not one of the choices") as info:
        space.complete({**space.baseline_params(), "checkpoint": "fp8"})
    assert info.value.allowed == ["mxfp4", "nvfp4"]
    with pytest.raises(ConfigError, match="outside"):
        space.complete({**space.baseline_params(), "max_running_requests": 256})
    with pytest.raises(ConfigError, match="not on the grid"):
        space.complete({**space.baseline_params(), "max_running_requests": 50})
    with pytest.raises(ConfigError, match="not one of the choices"):
        space.complete({**space.baseline_params(), "custom_all_reduce": 1})


def test_config_key(space: SearchSpace) -> None:
    base = space.baseline_config()
    key = space.config_key(base)
    assert len(key) == 16
    noisy = {**base, "mem_fraction_static": 0.8800000000000001}
    assert space.config_key(noisy) == key
    assert space.config_key(space.baseline_params()) == key  # derived values do not matter
    off = {**space.baseline_params(), "speculative": "off"}
    off_other_steps = {**off, "speculative_num_steps": 1}  # inactive: ignored
    assert space.config_key(off) == space.config_key(off_other_steps)
    assert space.config_key(off) != key
    assert space.config_key({**base, "mem_fraction_static": 0.87}) != key


def test_random_config_respects_conditions(space: SearchSpace) -> None:
    rng = random.Random(7)
    seen_active = {"nccl_min_nchannels": 0, "speculative_num_steps": 0, "cuda_graph_max_bs": 0}
    for _ in range(300):
        config = space.random_config(rng)
        assert ("nccl_min_nchannels" in config) == config["nccl_channels"]
        assert ("nccl_max_nchannels" in config) == config["nccl_channels"]
        assert ("speculative_num_steps" in config) == (config["speculative"] == "eagle")
        assert ("cuda_graph_max_bs" in config) == config["cuda_graph"]
        if "speculative_num_steps" in config:
            steps = config["speculative_num_steps"]
            assert isinstance(steps, int)
            assert config["speculative_num_draft_tokens"] == steps + 1
        assert space.complete(config) == config
        for name in seen_active:
            seen_active[name] += name in config
    assert all(60 < n < 240 for n in seen_active.values()), seen_active
    feasible = [space.random_config(rng, avoid_forbidden=True) for _ in range(50)]
    assert all(space.violations(c) == [] for c in feasible)


def test_grid_is_finite_and_contains_baseline(space: SearchSpace) -> None:
    grid = space.grid()
    assert set(grid) == {p.name for p in space.sampled_params}
    assert grid["moe_runner_backend"] == list(space.parameter("moe_runner_backend").choices or ())
    assert grid["nccl_channels"] == [False, True]
    assert grid["mem_fraction_static"] == [0.7, 0.82, 0.88, 0.95]
    assert grid["chunked_prefill_size"][0] == 1024 and grid["chunked_prefill_size"][-1] == 16384
    assert 8192 in grid["chunked_prefill_size"]
    for name, values in grid.items():
        param = space.parameter(name)
        if param.choices is None:
            assert values == sorted(values)  # type: ignore[type-var]
        else:
            assert values == list(param.choices)
        for value in values:
            assert param.normalize(value) == value
    assert len(space.grid(levels=5)["max_running_requests"]) >= 5
    with pytest.raises(ValueError):
        space.grid(levels=1)


def test_check_space_summary(space: SearchSpace) -> None:
    summary = check_space(BUNDLED)
    assert summary.name == "dsv4-flash-rtx6000-pd"
    assert summary.services == ("prefill", "decode")
    assert summary.by_type == {"categorical": 7, "int": 6, "float": 1, "bool": 5}
    assert summary.parameters == 19
    assert summary.conditional == 5
    assert summary.derived == 1
    assert summary.forbidden == 4
    assert summary.baseline_valid is True
    assert 1e13 < summary.approx_size < 1e15 and math.isfinite(summary.approx_size)
    text = str(summary)
    assert "19 sampled" in text and "forbidden rules: 4" in text and "baseline: valid" in text


def test_vllm_example_is_general() -> None:
    space = load_space(VLLM)
    assert space.services == ("server",)
    settings = space.settings_for("server", space.baseline_config())
    assert settings.flags["--gpu-memory-utilization"] == "0.9"
    assert settings.flags["--enable-prefix-caching"] is None
    assert "--no-enable-prefix-caching" in settings.remove_flags
    assert "--enforce-eager" in settings.remove_flags
    assert "VLLM_ATTENTION_BACKEND" in settings.unset_env
    config = space.complete({**space.baseline_params(), "prefix_caching": False})
    settings = space.settings_for("server", config)
    assert settings.flags["--no-enable-prefix-caching"] is None
    assert "--enable-prefix-caching" in settings.remove_flags
    bad = {
        **space.baseline_params(),
        "kv_cache_dtype": "fp8",
        "attention_backend": "FLASHINFER",
        "speculative": "ngram",
    }
    assert [v.name for v in space.violations(bad)] == ["fp8_kv_with_flashinfer_ngram"]
    summary = check_space(VLLM)
    assert summary.by_type["bool"] == 2 and summary.forbidden == 2
