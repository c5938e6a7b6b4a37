"""The bundled DeepSeek-V4-Flash space encodes the lever table, constraints and baseline."""

from __future__ import annotations

import math
import random

import pytest
from space_fixtures import BUNDLED, ROOT, VLLM

from autotune.deployment import load_deployment
from autotune.engines._manifest import load_manifest
from autotune.errors import ConfigError
from autotune.render import render
from autotune.sim import perf_model as pm
from autotune.sim.args import parse_config
from autotune.sim.levers import (
    BASELINE,
    CATEGORIES,
    LEVER_NAMES,
    active_levers,
    config_from_levers,
    pd_configs,
)
from autotune.sim.levers import violations as sim_violations
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
        "pcie_ipc_allreduce",
        "moe_runner_backend",
        "checkpoint",
        "sm120_flashmla_backend",
        "sm120_direct_swa_kv",
        "speculative",
        "speculative_num_steps",
        "speculative_num_draft_tokens",
        "prefill_speculative",
        "prefill_speculative_num_steps",
        "prefill_speculative_num_draft_tokens",
        "mem_fraction_static",
        "cuda_graph_backend_decode",
        "cuda_graph_bs_decode",
        "cuda_graph_max_bs_decode",
        "max_running_requests",
        "disable_overlap_schedule",
        "chunked_prefill_size",
        "pytorch_alloc_conf",
    ]
    assert {p.name for p in space.params} == set(LEVER_NAMES)  # the sim's contract
    p = space.parameter
    for name, choices in CATEGORIES.items():
        if p(name).kind != "bool":
            assert p(name).choices == choices, name
    assert p("nccl_proto").choices == ("unset", "LL", "LL128", "Simple")
    assert p("moe_runner_backend").choices == (
        "auto",
        "marlin",
        "triton",
        "cutlass",
        "flashinfer_mxfp4",
        "flashinfer_cutlass",
        "flashinfer_cutedsl",
    )
    assert p("sm120_flashmla_backend").choices == ("flashinfer", "triton", "torch")
    assert p("cuda_graph_backend_decode").choices == ("full", "breakable", "disabled")
    assert p("cuda_graph_bs_decode").choices == ("unset", "pow2-16", "pow2-32", "all-16")
    assert p("nccl_min_nchannels").domain_text() == "1..32 (log)"
    assert p("nccl_max_nchannels").domain_text() == "1..32 (log)"
    assert p("speculative_num_steps").domain_text() == "1..4"
    assert p("mem_fraction_static").domain_text() == "0.7..0.95 step 0.01"
    assert p("cuda_graph_max_bs_decode").domain_text() == "8..256 step 8"
    assert p("max_running_requests").domain_text() == "8..128 step 8"
    assert p("chunked_prefill_size").domain_text() == "1024..16384 step 1024"
    decode_only = {
        "speculative",
        "speculative_num_steps",
        "speculative_num_draft_tokens",
        "cuda_graph_backend_decode",
        "cuda_graph_bs_decode",
        "cuda_graph_max_bs_decode",
        "max_running_requests",
        "disable_overlap_schedule",
    }
    prefill_only = {
        "chunked_prefill_size",
        "prefill_speculative",
        "prefill_speculative_num_steps",
        "prefill_speculative_num_draft_tokens",
    }
    for param in space.params:
        if param.name in decode_only:
            assert param.services == ("decode",), param.name
        elif param.name in prefill_only:
            assert param.services == ("prefill",), param.name
        else:
            assert param.services == ("prefill", "decode"), param.name
    for param in space.params:
        assert "DOMAIN.md" in param.spec.description, param.name


def test_every_lever_cites_its_sglang_source(space: SearchSpace) -> None:
    """Each SGLang lever names the 0.5.23 source file it comes from (NCCL_* and the
    allocator are read by NCCL and torch, and cite what SGLang does with them)."""
    for param in space.params:
        if param.derived is not None:
            continue
        text = param.spec.description
        assert "srt/" in text or "kernels/" in text or param.name.startswith("nccl_"), param.name


def test_removed_and_noop_levers_are_gone(space: SearchSpace) -> None:
    names = {p.name for p in space.params}
    assert not names & {
        "custom_all_reduce",
        "triton_attention_num_kv_splits",
        "static_kv_splits",
        "cuda_graph",
        "cuda_graph_max_bs",
        "kv_cache_dtype",
        "flashinfer_mxfp4_moe_precision",
    }
    text = BUNDLED.read_text(encoding="utf-8")
    for reason in (
        "custom_all_reduce.py",
        "model_overrides/deepseek_v4.py",
        "mxfp4_flashinfer_cutlass_moe.py",
        "_deepseek_v4_kv_cache_dtype",
    ):
        assert reason in text  # each removal is explained in the file
    for config in [
        space.baseline_config(),
        *(space.random_config(random.Random(i)) for i in range(50)),
    ]:
        for service in ("prefill", "decode"):
            settings = space.settings_for(service, config)
            assert "--disable-custom-all-reduce" not in settings.flags
            assert "--triton-attention-num-kv-splits" not in settings.flags
            assert "--disable-cuda-graph" not in settings.flags  # deprecated in 0.5.23
            assert "SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS" not in settings.env


def test_every_flag_choice_and_variable_exists_in_sglang_0_5_23(space: SearchSpace) -> None:
    manifest = load_manifest("sglang", "0.5.23")
    env_names = manifest.env_names or frozenset()
    rng = random.Random(3)
    configs = [space.baseline_config(), *(space.random_config(rng) for _ in range(300))]
    for config in configs:
        for service in ("prefill", "decode"):
            settings = space.settings_for(service, config)
            for flag, value in settings.flags.items():
                resolution = manifest.resolve(flag)
                assert resolution.status == "exact", flag
                option = resolution.option
                assert option is not None and not option.deprecated, flag
                values = () if value is None else (value if isinstance(value, tuple) else (value,))
                assert option.takes_value == bool(values), flag
                if option.multi_value:
                    assert len(values) >= 1
                elif option.takes_value:
                    assert len(values) == 1, flag
                if option.choices is not None:
                    assert set(values) <= {str(c) for c in option.choices}, (flag, values)
            for flag in settings.remove_flags:
                assert manifest.resolve(flag).status == "exact", flag
            for name in set(settings.env) | settings.unset_env:
                if name.startswith("SGLANG_"):
                    assert name in env_names, name


def test_rendered_commands_parse_to_the_sims_contract(space: SearchSpace) -> None:
    """The space's commands, rendered for the bundled simulated deployment and parsed by the
    simulated servers, are exactly what the perf model's lever contract says."""
    deployment = load_deployment(ROOT / "launchers" / "sim-dsv4-flash-pd.yaml")
    rng = random.Random(9)
    configs = [space.baseline_config(), *(space.random_config(rng) for _ in range(60))]
    for config in configs:
        specs = render(space, deployment, config, run_dir=ROOT / "studies" / "runs" / "x")
        for service in ("prefill", "decode"):
            argv = list(specs[service].argv)
            parsed = parse_config(argv[argv.index("autotune.sim.server") + 1 :], {})
            parsed_env = parse_config(
                argv[argv.index("autotune.sim.server") + 1 :], specs[service].env
            )
            expected = config_from_levers(dict(config), mode=service)
            for field in (
                "moe_runner_backend",
                "quantization",
                "model_path",
                "mem_fraction_static",
                "cuda_graph_backend_decode",
                "cuda_graph_max_bs_decode",
                "cuda_graph_bs_decode",
                "max_running_requests",
                "disable_overlap_schedule",
                "chunked_prefill_size",
                "speculative_algorithm",
                "speculative_num_steps",
                "speculative_num_draft_tokens",
                "disable_radix_cache",
            ):
                assert getattr(parsed, field) == getattr(expected, field), (service, field)
            for field in (
                "nccl_proto",
                "nccl_algo",
                "nccl_min_nchannels",
                "nccl_max_nchannels",
                "pcie_ipc_allreduce",
                "sm120_flashmla_backend",
                "sm120_direct_swa_kv",
                "pytorch_cuda_alloc_conf",
            ):
                assert getattr(parsed_env, field) == getattr(expected, field), (service, field)


def test_baseline_is_exactly_todays_deployment(space: SearchSpace) -> None:
    assert space.baseline_config() == {
        "nccl_proto": "unset",
        "nccl_algo": "unset",
        "nccl_channels": False,
        "pcie_ipc_allreduce": False,
        "moe_runner_backend": "marlin",
        "checkpoint": "mxfp4",
        "sm120_flashmla_backend": "triton",
        "speculative": "eagle",
        "speculative_num_steps": 3,
        "speculative_num_draft_tokens": 4,
        "prefill_speculative": False,
        "mem_fraction_static": 0.88,
        "cuda_graph_backend_decode": "full",
        "cuda_graph_bs_decode": "unset",
        "cuda_graph_max_bs_decode": 8,
        "max_running_requests": 48,
        "disable_overlap_schedule": False,
        "chunked_prefill_size": 8192,
        "pytorch_alloc_conf": "unset",
    }
    assert space.baseline_config() == active_levers(BASELINE)
    assert "speculative_num_draft_tokens" not in space.baseline_params()
    assert space.violations(space.baseline_config()) == []


def test_baseline_is_25_tok_s_in_the_sim() -> None:
    """The baseline still describes the deployment as it runs today (DOMAIN.md §1)."""
    pre, dec = pd_configs(BASELINE)
    e = pm.expectation(dec, prefill=pre, concurrency=16, input_len=256, output_len=128)
    assert 20 <= e.output_throughput <= 30 and 400 <= 1000 * e.tpot_s <= 600


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
            "--cuda-graph-backend-decode": "full",
            "--cuda-graph-max-bs-decode": "8",
            "--max-running-requests": "48",
        },
        remove_flags={"--cuda-graph-bs-decode", "--disable-overlap-schedule"},
        env={
            "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "0",
            "SGLANG_SM120_FLASHMLA_BACKEND": "triton",
        },
        unset_env=NCCL_ENV | {"PYTORCH_CUDA_ALLOC_CONF", "SGLANG_OPT_SM120_DIRECT_SWA_KV"},
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
        remove_flags=SPEC_FLAGS - {"--disable-radix-cache"},  # decode-only speculation
        env={
            "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "0",
            "SGLANG_SM120_FLASHMLA_BACKEND": "triton",
        },
        unset_env=NCCL_ENV | {"PYTORCH_CUDA_ALLOC_CONF", "SGLANG_OPT_SM120_DIRECT_SWA_KV"},
    )


def test_service_outside_the_space_gets_nothing(space: SearchSpace) -> None:
    assert space.settings_for("router", space.baseline_config()) == ServiceSettings()


def test_switch_and_graph_semantics(space: SearchSpace) -> None:
    config = _with(space, cuda_graph_backend_decode="disabled", disable_overlap_schedule=True)
    decode = space.settings_for("decode", config)
    assert decode.flags["--cuda-graph-backend-decode"] == "disabled"
    assert decode.flags["--disable-overlap-schedule"] is None
    # the graph sizes are inactive without graphs: their flags are removed, not left stale
    assert "cuda_graph_max_bs_decode" not in config and "cuda_graph_bs_decode" not in config
    assert {"--cuda-graph-max-bs-decode", "--cuda-graph-bs-decode"} <= decode.remove_flags
    prefill = space.settings_for("prefill", config)
    assert not {"--cuda-graph-backend-decode", "--disable-overlap-schedule"} & (
        set(prefill.flags) | prefill.remove_flags
    )
    listed = _with(space, cuda_graph_bs_decode="pow2-16")
    assert "cuda_graph_max_bs_decode" not in listed  # the list sets the max
    decode = space.settings_for("decode", listed)
    assert decode.flags["--cuda-graph-bs-decode"] == ("1", "2", "4", "8", "16")
    assert "--cuda-graph-max-bs-decode" in decode.remove_flags


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
        sm120_flashmla_backend="flashinfer",
        sm120_direct_swa_kv=True,
    )
    decode = space.settings_for("decode", config)
    assert decode.env == {
        "NCCL_PROTO": "LL",
        "NCCL_ALGO": "Tree",
        "NCCL_MIN_NCHANNELS": "2",
        "NCCL_MAX_NCHANNELS": "16",
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "SGLANG_SM120_FLASHMLA_BACKEND": "flashinfer",
        "SGLANG_OPT_SM120_DIRECT_SWA_KV": "1",
    }
    assert decode.unset_env == set()
    prefill = space.settings_for("prefill", config)
    assert prefill.env == decode.env  # both servers: the PD transfer checks the KV layout
    triton = _with(space, sm120_flashmla_backend="triton")
    assert "sm120_direct_swa_kv" not in triton  # does nothing for triton/torch
    assert "SGLANG_OPT_SM120_DIRECT_SWA_KV" in space.settings_for("decode", triton).unset_env


def test_map_semantics_checkpoint(space: SearchSpace) -> None:
    config = _with(space, checkpoint="nvfp4", moe_runner_backend="flashinfer_cutlass")
    for service in ("prefill", "decode"):
        settings = space.settings_for(service, config)
        assert settings.flags["--model-path"] == "/models/DeepSeek-V4-Flash-NVFP4"
        assert settings.flags["--quantization"] == "modelopt_fp4"
        assert settings.flags["--moe-runner-backend"] == "flashinfer_cutlass"
    assert space.violations(config) == []


SPEC_FLAGS = {
    "--speculative-algorithm",
    "--speculative-eagle-topk",
    "--disable-radix-cache",
    "--speculative-num-steps",
    "--speculative-num-draft-tokens",
}


def test_map_semantics_speculative_off_removes_everything(space: SearchSpace) -> None:
    params = space.baseline_params()
    params["speculative"] = "off"
    config = space.complete(params)  # steps given but inactive: dropped
    assert "speculative_num_steps" not in config
    assert "speculative_num_draft_tokens" not in config
    assert "prefill_speculative" not in config
    decode = space.settings_for("decode", config)
    assert not SPEC_FLAGS & set(decode.flags)
    assert decode.remove_flags >= SPEC_FLAGS
    prefill = space.settings_for("prefill", config)
    assert not SPEC_FLAGS & set(prefill.flags)


def test_speculation_on_prefill_follows_the_decode_depth(space: SearchSpace) -> None:
    for steps in range(1, 5):
        config = _with(space, speculative_num_steps=steps, prefill_speculative=True)
        assert config["prefill_speculative_num_steps"] == steps
        assert config["prefill_speculative_num_draft_tokens"] == steps + 1
        prefill = space.settings_for("prefill", config)
        assert prefill.flags["--speculative-algorithm"] == "EAGLE"
        assert prefill.flags["--speculative-eagle-topk"] == "1"
        assert prefill.flags["--speculative-num-steps"] == str(steps)
        assert prefill.flags["--speculative-num-draft-tokens"] == str(steps + 1)
        assert "--disable-radix-cache" not in prefill.flags
    decode_only = _with(space, prefill_speculative=False)
    assert "prefill_speculative_num_steps" not in decode_only
    prefill = space.settings_for("prefill", decode_only)
    assert SPEC_FLAGS - {"--disable-radix-cache"} <= prefill.remove_flags


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
        ({"moe_runner_backend": "flashinfer_cutedsl"}, "flashinfer_cutedsl_needs_nvfp4"),
        (
            {"moe_runner_backend": "flashinfer_mxfp4", "checkpoint": "nvfp4"},
            "flashinfer_mxfp4_needs_mxfp4",
        ),
        ({"moe_runner_backend": "auto", "checkpoint": "nvfp4"}, "auto_runner_nvfp4_is_sm100_only"),
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
    assert sim_violations({**BASELINE, **changes})  # the sim's contract agrees


def test_allowed_neighbours_of_forbidden(space: SearchSpace) -> None:
    ok: list[dict[str, Value]] = [
        {"moe_runner_backend": "flashinfer_mxfp4"},
        {"moe_runner_backend": "auto"},
        {"moe_runner_backend": "flashinfer_cutlass", "checkpoint": "nvfp4"},
        {"moe_runner_backend": "flashinfer_cutedsl", "checkpoint": "nvfp4"},
        {"nccl_channels": True, "nccl_min_nchannels": 4, "nccl_max_nchannels": 4},
        {"moe_runner_backend": "cutlass", "checkpoint": "nvfp4"},
    ]
    for changes in ok:
        assert space.violations(_with(space, **changes)) == [], changes
        assert not sim_violations({**BASELINE, **changes}), changes


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
        space.complete({**space.baseline_params(), "disable_overlap_schedule": 1})


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
    seen_active = {
        "nccl_min_nchannels": 0,
        "speculative_num_steps": 0,
        "cuda_graph_max_bs_decode": 0,
        "cuda_graph_bs_decode": 0,
        "sm120_direct_swa_kv": 0,
        "prefill_speculative": 0,
    }
    for _ in range(300):
        config = space.random_config(rng)
        graphs = config["cuda_graph_backend_decode"] != "disabled"
        assert ("nccl_min_nchannels" in config) == config["nccl_channels"]
        assert ("nccl_max_nchannels" in config) == config["nccl_channels"]
        assert ("speculative_num_steps" in config) == (config["speculative"] == "eagle")
        assert ("prefill_speculative" in config) == (config["speculative"] == "eagle")
        assert ("cuda_graph_bs_decode" in config) == graphs
        assert ("cuda_graph_max_bs_decode" in config) == (
            graphs and config["cuda_graph_bs_decode"] == "unset"
        )
        assert ("sm120_direct_swa_kv" in config) == (
            config["sm120_flashmla_backend"] == "flashinfer"
        )
        if "speculative_num_steps" in config:
            steps = config["speculative_num_steps"]
            assert isinstance(steps, int)
            assert config["speculative_num_draft_tokens"] == steps + 1
            assert ("prefill_speculative_num_steps" in config) == config["prefill_speculative"]
        assert space.complete(config) == config
        assert config == active_levers(config)  # the sim's contract has the same conditions
        for name in seen_active:
            seen_active[name] += name in config
    assert all(30 < n < 270 for n in seen_active.values()), seen_active
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
    assert summary.by_type == {"categorical": 9, "int": 6, "float": 1, "bool": 5}
    assert summary.parameters == 21
    assert summary.conditional == 10
    assert summary.derived == 3
    assert summary.forbidden == 6
    assert summary.baseline_valid is True
    assert 1e14 < summary.approx_size < 1e17 and math.isfinite(summary.approx_size)
    text = str(summary)
    assert "21 sampled" in text and "forbidden rules: 6" in text and "baseline: valid" in text


def test_vllm_cpu_is_general() -> None:
    """The format is not SGLang-specific: switches in maps, VLLM_* variables, a JSON flag."""
    space = load_space(VLLM)
    assert space.services == ("server",)
    base = space.baseline_config()
    settings = space.settings_for("server", base)
    assert settings.flags["--max-num-seqs"] == "128"
    assert settings.flags["--block-size"] == "128"
    assert settings.flags["--enable-prefix-caching"] is None
    assert "--no-enable-prefix-caching" in settings.remove_flags
    assert "--enforce-eager" in settings.remove_flags
    assert "--compilation-config" in settings.remove_flags  # compilation_mode: default
    assert settings.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert settings.env["VLLM_CPU_OMP_THREADS_BIND"] == "auto"
    config = space.complete(
        {**space.baseline_params(), "enable_prefix_caching": False, "compilation_mode": "NONE"}
    )
    settings = space.settings_for("server", config)
    assert settings.flags["--no-enable-prefix-caching"] is None
    assert "--enable-prefix-caching" in settings.remove_flags
    assert settings.flags["--compilation-config"] == '{"mode": "NONE"}'
    eager = space.complete({**space.baseline_params(), "enforce_eager": True})
    assert "compilation_mode" not in eager  # conditional: only without --enforce-eager
    assert space.settings_for("server", eager).flags["--enforce-eager"] is None
    # The start-up failure vLLM refuses at config time is deliberately left reachable.
    refused = {
        **space.baseline_params(),
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": 1024,
    }
    assert space.violations(refused) == []
    summary = check_space(VLLM)
    assert summary.by_type["bool"] == 4 and summary.forbidden == 0 and summary.conditional == 1
