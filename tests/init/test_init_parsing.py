"""Reading a command: its environment, wrapper and program, the engine it runs, and every option
typed by that engine's own parser (the committed manifests), refusals named with the closest
real options."""

from __future__ import annotations

from typing import Any

import pytest

from autotune.engines import get_engine
from autotune.errors import ConfigError
from autotune.init.commandline import generic_program_start, split_command
from autotune.init.engines import find_program
from autotune.init.model import ImportedService, RawService
from autotune.init.options import read_env, read_options
from autotune.init.reading import ReadOptions, read_service


def read(command: str, **opts: Any) -> tuple[ImportedService, list[str]]:
    text = split_command(command)
    notes: list[str] = []
    raw = RawService(origin="test", argv=text.argv, env=text.env)
    return read_service(raw, ReadOptions(**opts), notes), notes


# ------------------------------------------------------------------ the command line
def test_variables_env_and_wrappers_are_told_apart() -> None:
    text = split_command(
        "HF_HUB_OFFLINE=1 env -u NCCL_PROTO CUDA_VISIBLE_DEVICES=0,1 numactl --cpunodebind=0 "
        "--membind=0 /venv/bin/python -u -m sglang.launch_server --model-path /m --port 30000"
    )
    assert text.env == {"HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert text.unset == ["NCCL_PROTO"]
    service, _ = read(" ".join(["CUDA_VISIBLE_DEVICES=0,1", *map(repr, text.argv)]))
    assert service.wrapper == ["numactl", "--cpunodebind=0", "--membind=0"]
    assert service.head == ["/venv/bin/python", "-u", "-m", "sglang.launch_server"]
    assert service.engine.name == "sglang"


@pytest.mark.parametrize(
    "command",
    ["vllm serve m | tee log", "vllm serve m && echo done", "vllm serve m > log"],
)
def test_a_shell_pipeline_is_refused(command: str) -> None:
    with pytest.raises(ConfigError, match="pipeline or list"):
        split_command(command)


def test_env_i_is_refused() -> None:
    with pytest.raises(ConfigError, match="empty environment"):
        split_command("env -i A=1 vllm serve m")


def test_generic_wrappers_are_skipped() -> None:
    assert generic_program_start(["taskset", "-c", "0-3", "./server", "--port", "1"]) == 3
    assert generic_program_start(["numactl", "-N", "0", "--membind=0", "./s"]) == 4
    assert generic_program_start(["./s", "--port", "1"]) == 0


# ------------------------------------------------------------------ which engine
@pytest.mark.parametrize(
    ("argv", "engine"),
    [
        ("python -m sglang.launch_server --model-path m", "sglang"),
        ("sglang serve --model-path m", "sglang"),
        (
            "/v/bin/python3.11 -m sglang_router.launch_router --worker-urls http://a:1",
            "sglang-router",
        ),
        ("sglang-router launch --worker-urls http://a:1", "sglang-router"),
        ("python -m sglang_router launch --worker-urls http://a:1", "sglang-router"),
        ("vllm serve m --port 8000", "vllm"),
        ("python3 -m vllm.entrypoints.openai.api_server --model m", "vllm"),
        ("transformers serve m --port 8000", "transformers-serve"),
        ("python -m transformers.cli.transformers serve m", "transformers-serve"),
    ],
)
def test_the_engine_is_told_by_its_program(argv: str, engine: str) -> None:
    found = find_program(argv.split())
    assert found is not None and found.engine == engine


def test_another_program_is_the_generic_engine_and_must_say_its_health() -> None:
    with pytest.raises(ConfigError, match="give --health PATH"):
        read("./my-server --port 9000")
    service, notes = read("./my-server --port 9000 --threads 4", health={"": "/ready"})
    assert service.engine.name == "generic"
    assert service.port == 9000 and service.health_path == "/ready"
    assert any("generic engine" in n for n in notes)
    with pytest.raises(ConfigError, match="which port"):
        read("./my-server --threads 4", health={"": "/ready"})


def test_the_release_is_the_pinned_one_unless_told_and_must_have_a_manifest() -> None:
    service, notes = read("vllm serve m")
    assert service.engine.version == "0.32.0"
    assert any("release autotune pins" in n for n in notes)
    service, _ = read("vllm serve m", versions={"vllm": "0.26.0"})
    assert service.engine.version == "0.26.0"
    with pytest.raises(ConfigError, match="vllm 0.31.0 .* has no manifest") as caught:
        read("vllm serve m", versions={"": "0.31.0"})
    assert caught.value.allowed == ["0.26.0", "0.32.0", "0.33.0"]


# ------------------------------------------------------------------ options through the manifest
def test_options_are_typed_by_the_parser() -> None:
    service, _ = read(
        "vllm serve m --max-num-seqs 4 --gpu-memory-utilization=0.85 --enforce-eager "
        "--no-enable-prefix-caching --kv-cache-dtype fp8"
    )
    values = {o.flag: o.value for o in service.options}
    assert values == {
        "--max-num-seqs": 4,
        "--gpu-memory-utilization": 0.85,
        "--enforce-eager": True,
        "--no-enable-prefix-caching": False,
        "--kv-cache-dtype": "fp8",
    }
    gpu_util = service.option("--gpu-memory-utilization")
    assert gpu_util is not None and gpu_util.eq
    router, _ = read(
        "python -m sglang_router.launch_router --pd-disaggregation --prefill http://p:1 8998 "
        "--decode http://d:2 --port 8000"
    )
    prefill = router.option("--prefill")
    assert prefill is not None and prefill.value == ["http://p:1", "8998"]
    assert router.role == "router" and router.port == 8000


def test_an_unknown_option_names_the_closest_real_ones() -> None:
    with pytest.raises(ConfigError, match="unknown option --max-num-seq-s in vllm 0.32.0") as e:
        read("vllm serve m --max-num-seq-s 4")
    assert "--max-num-seqs" in (e.value.closest or [])
    assert "closest" in str(e.value)


def test_a_removed_flag_that_became_an_ambiguous_prefix_is_refused() -> None:
    # SGLang 0.5.20 split --cuda-graph-max-bs into -decode/-prefill (DOMAIN.md section 2).
    with pytest.raises(ConfigError, match="ambiguous option --cuda-graph-max-bs") as caught:
        read("python -m sglang.launch_server --model-path m --cuda-graph-max-bs 8")
    assert set(caught.value.closest or []) >= {
        "--cuda-graph-max-bs-decode",
        "--cuda-graph-max-bs-prefill",
    }


def test_a_value_the_parser_refuses_is_refused() -> None:
    with pytest.raises(ConfigError, match="invalid choice 'fast'"):
        read("python -m sglang.launch_server --model-path m --schedule-policy fast")
    with pytest.raises(ConfigError, match="invalid int value 'many'"):
        read("vllm serve m --max-num-seqs many")


def test_spellings_the_renderer_cannot_edit_are_written_in_full() -> None:
    service, notes = read("vllm serve m -tp 2 --max_num_seqs 8 -O3 --max-num-batch 512")
    tokens = service.argv()
    assert tokens == [
        "vllm", "serve", "m",
        "--tensor-parallel-size", "2",
        "--max-num-seqs", "8",
        "--optimization-level", "3",
        "--max-num-batched-tokens", "512",
    ]  # fmt: skip
    joined = " ".join(notes)
    assert (
        "short alias" in joined and "abbreviation" in joined and "FlexibleArgumentParser" in joined
    )


def test_click_positionals_between_options_move_before_them() -> None:
    service, notes = read("transformers serve --port 8010 /models/m --continuous-batching")
    assert service.head == ["transformers", "serve", "/models/m"]
    assert service.model == "/models/m"
    assert any("moved before the options" in n for n in notes)


def test_the_engines_variables_are_checked_and_typed() -> None:
    sglang = get_engine("sglang", "0.5.23")
    typed = read_env(
        sglang,
        {
            "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1",
            "NCCL_PROTO": "LL",
            "SGLANG_PCIE_IPC_MAX_NUMEL": "64",
        },
        origin="t",
    )
    assert typed == {
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": True,
        "NCCL_PROTO": "LL",
        "SGLANG_PCIE_IPC_MAX_NUMEL": 64,
    }
    with pytest.raises(ConfigError, match="not a variable sglang 0.5.23 reads") as caught:
        read_env(sglang, {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCES": "1"}, origin="t")
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" in (caught.value.closest or [])
    with pytest.raises(ConfigError, match="not a boolean"):
        read_env(sglang, {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "maybe"}, origin="t")


def test_options_of_the_generic_engine_are_kept_as_written() -> None:
    options, moved = read_options(
        get_engine("generic"), ["--a", "1", "2", "--b=x", "--c"], origin="t", notes=[]
    )
    assert moved == []
    assert [o.tokens() for o in options] == [["--a", "1", "2"], ["--b=x"], ["--c"]]


# ------------------------------------------------------------------ where it answers
def test_ports_hosts_and_endpoints_come_from_the_command() -> None:
    service, notes = read("vllm serve m --host 0.0.0.0")
    assert (service.host, service.port) == ("127.0.0.1", 8000)
    assert any("default 8000" in n for n in notes)
    assert service.info_path == "/version" and service.metrics_path == "/metrics"
    sglang, _ = read("python -m sglang.launch_server --model-path m --host 10.0.0.5 --port 31000")
    assert (sglang.host, sglang.port) == ("10.0.0.5", 31000)
    assert sglang.metrics_path is None  # no --enable-metrics
    decode, _ = read("python -m sglang.launch_server --model-path m --disaggregation-mode decode")
    assert decode.role == "decode"


def test_the_platform_is_read_from_the_command() -> None:
    cpu, _ = read("VLLM_CPU_KVCACHE_SPACE=4 vllm serve m")
    gpu, _ = read("vllm serve m")
    told, _ = read("vllm serve m", platform="cpu")
    assert (cpu.platform, gpu.platform, told.platform) == ("cpu", "gpu", "cpu")
