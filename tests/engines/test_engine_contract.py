"""Every engine passes the same contract (in the style of Optuna's shared sampler tests);
then what each engine's manifest must say about options that matter to the bundled spaces."""

from __future__ import annotations

import re

import pytest

from autotune.engines import (
    ENGINES,
    BaseEngine,
    GenericEngine,
    available_manifests,
    engine_for_command,
    get_engine,
    load_manifest,
)
from autotune.errors import ConfigError
from autotune.launch.classify import FailureClass, classify_log

CHECKED = sorted(n for n in ENGINES if n != "generic")


@pytest.fixture(params=sorted(ENGINES))
def engine(request: pytest.FixtureRequest) -> BaseEngine:
    return get_engine(request.param)


# ------------------------------------------------------------------ the contract


def test_name_registry_and_manifest(engine: BaseEngine) -> None:
    assert ENGINES[engine.name] is type(engine)
    if isinstance(engine, GenericEngine):
        assert engine.manifest is None
        return
    assert engine.version in available_manifests()[engine.name]
    manifest = engine.manifest
    assert manifest is not None
    assert (manifest.engine, manifest.version) == (engine.name, engine.version)
    assert len(manifest.options) >= 15
    assert manifest.generated_by.startswith("scripts/engines/manifest.py")


def test_every_real_option_passes_and_malformed_ones_fail(engine: BaseEngine) -> None:
    assert engine.check_flag("-x") is not None
    assert engine.check_flag("--a=b") is not None
    manifest = engine.manifest
    if manifest is None:
        assert engine.check_flag("--anything-goes") is None
        return
    for option in manifest.options:
        for flag in (f for f in option.flags if f.startswith("--")):  # never a short form
            problem = engine.check_flag(flag)
            assert problem is None or problem.kind == "deprecated", (flag, problem)


def test_unknown_option_names_the_closest(engine: BaseEngine) -> None:
    manifest = engine.manifest
    if manifest is None:
        return
    real = max((f for o in manifest.options for f in o.flags), key=len)
    typo = real[:-1] + ("x" if real[-1] != "x" else "y")
    problem = engine.check_flag(typo)
    assert problem is not None and problem.kind in ("unknown", "ambiguous", "abbreviation")
    assert real in problem.suggestions


def test_failure_patterns_compile_and_name_a_stored_class(engine: BaseEngine) -> None:
    for pattern in engine.failure_patterns:
        re.compile(pattern.pattern)
        FailureClass(pattern.failure)
        assert 0 < pattern.priority <= 100


def test_start_stages_compile_with_one_label_each(engine: BaseEngine) -> None:
    for stage in engine.start_stages:
        re.compile(stage.pattern)
        assert stage.label and stage.label == stage.label.strip()
        # the reason reads "(while LABEL)": a label is what the engine is doing
        assert stage.label.split()[0].endswith("ing"), stage.label
    labels = [s.label for s in engine.start_stages]
    assert len(labels) == len(set(labels))  # one label per stage: the reason names one


def test_metric_names_carry_the_engine_prefix(engine: BaseEngine) -> None:
    names = engine.metrics.names()
    prefix = {"sglang": "sglang:", "vllm": "vllm:"}.get(engine.name)
    if prefix is None:
        assert names == {}
        return
    assert {"running", "queued", "generation_tokens"} <= set(names)
    assert all(n.startswith(prefix) for n in names.values())


def test_version_is_read_back_and_a_mismatch_names_both(engine: BaseEngine) -> None:
    if engine.version is None:
        assert engine.version_mismatch("s", {"version": "9.9.9"}) is None
        return
    assert engine.version_from({"version": engine.version}) == engine.version
    assert engine.version_mismatch("decode", {"version": engine.version}) is None
    assert engine.version_mismatch("decode", {}) is None
    warning = engine.version_mismatch("decode", {"version": "9.9.9"})
    assert warning is not None and "9.9.9" in warning and engine.version in warning


def test_program_detection(engine: BaseEngine) -> None:
    for program in engine.programs:
        argv = ["/usr/bin/numactl", "--membind=1", *program.split(), "--port", "1"]
        if program.endswith(".launch_server") or "." in program.split()[0]:
            argv = ["numactl", "--membind=1", "/venv/bin/python", "-m", program, "--port", "1"]
        found = engine_for_command(argv)
        assert found is not None and found.name == engine.name
        assert argv[engine.options_start(argv)] == "--port"


# ------------------------------------------------------------------ engine facts


def test_sglang_0_5_23_removed_and_renamed_options() -> None:
    sglang = get_engine("sglang", "0.5.23")
    ambiguous = sglang.check_flag("--cuda-graph-max-bs")
    assert ambiguous is not None and ambiguous.kind == "ambiguous"
    assert set(ambiguous.suggestions) == {
        "--cuda-graph-max-bs-decode",
        "--cuda-graph-max-bs-prefill",
    }
    for gone in ("--impl", "--enable-ep-moe", "--nsa-decode-backend", "--nsa-prefill-backend"):
        problem = sglang.check_flag(gone)
        assert problem is not None and problem.kind in ("unknown", "ambiguous"), gone
    deprecated = sglang.check_flag("--disable-cuda-graph")
    assert deprecated is not None and deprecated.severity == "warning"
    assert "--cuda-graph-backend" in deprecated.message
    abbreviated = sglang.check_flag("--tp")
    assert abbreviated is not None and abbreviated.suggestions == ("--tp-size",)
    assert sglang.check_env("SGLANG_SM120_FLASHMLA_BACKEND") is None
    assert sglang.check_env("NCCL_PROTO") is None  # not SGLang's to judge
    unknown = sglang.check_env("SGLANG_SM120_FLASHMLA_BACKENDS")
    assert unknown is not None and "SGLANG_SM120_FLASHMLA_BACKEND" in unknown.suggestions


def test_check_command_reads_values_like_the_parser() -> None:
    sglang = get_engine("sglang")
    argv = [
        "numactl", "--cpunodebind=1", "python", "-m", "sglang.launch_server",
        "--model-path", "/m", "--tp-size", "4", "--kv-cache-dtype=fp8_e4m3",
        "--cuda-graph-bs-decode", "1", "2", "4", "--disable-radix-cache",
        "--mem-fraction-static", "0.8",
    ]  # fmt: skip
    assert sglang.check_command(argv) == []
    bad = sglang.check_command(
        [*argv, "--kv-cache-dtype", "fp9", "--tp-size", "four", "--disable-radix-cache=1", "x"]
    )
    assert [p.kind for p in bad] == [
        "invalid_choice",
        "invalid_value",
        "unexpected_value",
        "unexpected_value",
    ]
    assert "fp8_e4m3" in bad[0].suggestions
    missing = sglang.check_command(["sglang", "serve", "--model-path", "--tp-size", "4"])
    assert [p.kind for p in missing] == ["missing_value"]


def test_flags_from_server_info_maps_fields_back_to_flags() -> None:
    sglang = get_engine("sglang")
    flags = sglang.flags_from_server_info(
        {"tp_size": 4, "cuda_graph_max_bs_decode": 8, "version": "0.5.23", "internal_states": []}
    )
    assert flags == {"--tp-size": 4, "--cuda-graph-max-bs-decode": 8}


def test_request_quirks() -> None:
    assert get_engine("sglang").quirks.ignore_eos is True
    assert get_engine("vllm").quirks.require_done is True
    ts = get_engine("transformers-serve").quirks
    assert (ts.ignore_eos, ts.require_done, ts.prompt, ts.pin_model) == (None, False, "text", True)


def test_unknown_engine_and_version_name_what_exists() -> None:
    with pytest.raises(ConfigError, match="unknown engine 'tgi'") as info:
        get_engine("tgi")
    assert "sglang" in (info.value.allowed or [])
    with pytest.raises(ConfigError, match="no manifest for sglang 0.4.0") as info:
        get_engine("sglang", "0.4.0")
    assert "0.5.23" in (info.value.allowed or [])


def test_engine_log_patterns_reach_the_classifier() -> None:
    vllm_line = "ValueError: No common block size for 16 (CPU_ATTN: [MultipleOf(32)])"
    assert classify_log(vllm_line).failure is FailureClass.config_rejected
    oom = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
    assert classify_log(oom).failure is FailureClass.cuda_oom
    panic = (
        "failed to install Prometheus metrics exporter: FailedToCreateHTTPListener"
        '("Address already in use (os error 98)")'
    )
    assert classify_log(panic).failure is FailureClass.port_in_use


@pytest.mark.parametrize("name", CHECKED)
def test_manifests_load_for_every_registered_engine(name: str) -> None:
    versions = available_manifests()[name]
    assert versions
    for version in versions:
        assert load_manifest(name, version).engine == name


def test_spellings_a_parser_hides_from_help_still_check() -> None:
    """vLLM 0.33.0 shows --enable-x / --disable-x and hides --no-enable-x, which still parses
    (EnableDisableAction): the manifest keeps every registered spelling."""
    vllm = get_engine("vllm", "0.33.0")
    for flag in (
        "--enable-prefix-caching",
        "--disable-prefix-caching",
        "--no-enable-prefix-caching",
    ):
        assert vllm.check_flag(flag) is None, flag
    assert vllm.check_flag("--no-disable-cascade-attn") is None  # was --disable-cascade-attn
    assert get_engine("vllm", "0.32.0").check_flag("--disable-prefix-caching") is not None
