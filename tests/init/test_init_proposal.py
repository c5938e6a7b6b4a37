"""The proposed space: the catalog's cited levers around today's values, per engine and release,
and the engines' published recipes enqueued with their source."""

from __future__ import annotations

from importlib import resources

import pytest
import yaml
from init_helpers import Init

from autotune.engines import available_manifests, get_engine, load_manifest
from autotune.init.catalog import COMMON, load_catalog


def _catalogs() -> list[str]:
    return [
        entry.name[: -len(".yaml")]
        for entry in resources.files("autotune.init.catalog").iterdir()
        if entry.name.endswith(".yaml")
    ]


def test_every_catalog_lever_exists_in_a_release_of_its_engine_and_cites_a_source() -> None:
    """The catalog is curated, not typed from memory: each flag is in a manifest generated
    from the engine's real parser, each candidate passes that parser, each lever cites."""
    names = _catalogs()
    assert set(names) >= {"vllm", "sglang", "sglang-router", "transformers-serve", COMMON}
    for name in names:
        catalog = load_catalog(name)
        assert catalog.engine == name
        for lever in catalog.levers:
            assert lever.cite.strip() and lever.why.strip(), lever.name
            if name == COMMON:
                assert lever.kind == "env" and lever.engines, lever.name
                continue
            versions = available_manifests()[name]
            for flag in lever.owned_flags():
                having = [v for v in versions if load_manifest(name, v).option(flag)]
                assert having, f"{name}: {lever.name}: {flag} is in no manifest"
                for version in having:
                    engine = get_engine(name, version)
                    for value in lever.candidates if lever.kind != "bool" else []:
                        text = str(value)
                        problem = engine.check_values(flag, [text])
                        # a release may refuse a value (the proposal drops it there), but
                        # never every release: then the candidate is a typo
                        if problem is None:
                            break
                    else:
                        if lever.kind not in ("bool", "map"):
                            pytest.fail(f"{name} {version}: {lever.name}: no candidate parses")
            if lever.env is not None and lever.env.startswith(get_engine(name).env_prefixes):
                assert any(
                    lever.env in (load_manifest(name, v).env_names or ()) for v in versions
                ), lever.name
        for recipe in catalog.recipes:
            assert recipe.cite.startswith("https://"), recipe.name
            levers = {lever.name for lever in catalog.levers}
            assert set(recipe.set) <= levers, recipe.name


def test_ranges_are_around_todays_values_and_unset_levers_offer_the_default(init: Init) -> None:
    init(
        "--from-command",
        "vllm serve /m --max-num-seqs 64 --gpu-memory-utilization 0.88 --no-enable-prefix-caching "
        "--block-size 32 --enforce-eager",
    )
    _, space, _ = init.load()
    params, baseline = space["parameters"], space["baseline"]
    seqs = params["max_num_seqs"]
    assert (seqs["type"], seqs["low"], seqs["high"], seqs.get("log")) == ("int", 16, 256, True)
    assert baseline["max_num_seqs"] == 64
    mem = params["gpu_memory_utilization"]
    assert (mem["low"], mem["high"], mem["step"]) == (0.83, 0.93, 0.01)
    assert baseline["gpu_memory_utilization"] == 0.88
    # today's spelling of the off switch is the "off" choice: rendering it changes nothing
    assert params["enable_prefix_caching"]["target"]["map"]["off"] == {
        "switches": ["--no-enable-prefix-caching"]
    }
    assert baseline["enable_prefix_caching"] == "off"
    assert baseline["block_size"] == 32 and 16 in params["block_size"]["choices"]
    assert baseline["enforce_eager"] == "on"
    # not given today: the engine's own value (flag left out) among the candidates
    tokens = params["max_num_batched_tokens"]
    assert tokens["choices"][0] == "default" and baseline["max_num_batched_tokens"] == "default"
    assert tokens["target"] == {"flag": "--max-num-batched-tokens", "unset_value": "default"}
    # GPU levers on a GPU command, no CPU build variable
    assert "kv_cache_space_gib" not in params and "async_scheduling" in params
    # one GPU: nothing about NCCL or expert parallelism
    assert not {"nccl_proto", "enable_expert_parallel", "disable_custom_all_reduce"} & set(params)
    for param in params.values():
        assert "Source: " in param["description"]


def test_a_value_written_differently_from_the_spaces_rendering_stays_as_written(
    init: Init,
) -> None:
    init(
        "--from-command",
        "python -m sglang.launch_server --model-path /m --mem-fraction-static 0.80",
    )
    _, space, _ = init.load()
    mem = space["parameters"]["mem_fraction_static"]
    assert mem["type"] == "categorical" and "0.80" in mem["choices"]
    assert space["baseline"]["mem_fraction_static"] == "0.80"


def test_services_with_different_settings_get_a_parameter_each(init: Init) -> None:
    base = "python -m sglang.launch_server --model-path /m --tp-size 1 --disaggregation-mode"
    init(
        "--from-command", f"{base} prefill --port 30000 --mem-fraction-static 0.8",
        "--from-command", f"{base} decode --port 30001 --mem-fraction-static 0.9",
        "--from-command", "python -m sglang_router.launch_router --pd-disaggregation "
        "--prefill http://127.0.0.1:30000 8998 --decode http://127.0.0.1:30001 --port 8000",
    )  # fmt: skip
    _, space, _ = init.load()
    params = space["parameters"]
    assert params["mem_fraction_static_prefill"]["services"] == ["prefill"]
    assert params["mem_fraction_static_decode"]["services"] == ["decode"]
    assert params["stream_interval"]["services"] == ["prefill", "decode"]  # same today: shared
    assert params["chunked_prefill_size"]["services"] == ["prefill"]  # a prefill's lever
    assert params["max_running_requests"]["services"] == ["decode"]


def test_several_gpus_bring_the_collective_levers(init: Init) -> None:
    init("--from-command", "NCCL_PROTO=LL vllm serve /m --tensor-parallel-size 4")
    _, space, _ = init.load()
    params = space["parameters"]
    proto = params["nccl_proto"]
    assert proto["target"] == {"env": "NCCL_PROTO", "unset_value": "unset"}
    assert space["baseline"]["nccl_proto"] == "LL"
    assert {"nccl_algo", "disable_custom_all_reduce"} <= set(params)


def test_the_vllm_recipe_for_deepseek_is_enqueued_with_its_source(init: Init) -> None:
    result = init("--from-command", "vllm serve deepseek-ai/DeepSeek-V3 --tensor-parallel-size 8")
    _, space, study = init.load()
    assert study["enqueue"] == [{"enable_expert_parallel": "on"}]
    assert space["baseline"]["enable_expert_parallel"] == "default"
    text = init.files()[2].read_text()
    assert "https://docs.vllm.ai/projects/recipes/en/latest/DeepSeek/DeepSeek-V3.html" in text
    assert "recipe deepseek-v3-expert-parallel enqueued" in result.output


def test_the_sglang_recipe_for_deepseek_is_enqueued_with_its_source(init: Init) -> None:
    init(
        "--from-command",
        "python -m sglang.launch_server --model-path /models/DeepSeek-R1 --tp-size 8 --port 30000",
    )
    _, space, study = init.load()
    assert study["enqueue"] == [{"mtp": "steps1"}]
    mtp = space["parameters"]["mtp"]["target"]["map"]["steps1"]["flags"]
    assert mtp == {
        "--speculative-algorithm": "EAGLE",
        "--speculative-num-steps": 1,
        "--speculative-eagle-topk": 1,
        "--speculative-num-draft-tokens": 2,
    }
    assert "docs.sglang.ai" in init.files()[2].read_text()


def test_a_deployment_that_runs_the_recipe_already_enqueues_nothing(init: Init) -> None:
    result = init(
        "--from-command",
        "python -m sglang.launch_server --model-path /models/DeepSeek-R1 --tp-size 8 "
        "--speculative-algorithm EAGLE --speculative-num-steps 1 --speculative-eagle-topk 1 "
        "--speculative-num-draft-tokens 2",
    )
    _, space, study = init.load()
    assert "enqueue" not in study
    assert space["baseline"]["mtp"] == "steps1"
    assert "already runs it" in result.output


def test_todays_own_speculative_setting_is_a_choice(init: Init) -> None:
    init(
        "--from-command",
        "python -m sglang.launch_server --model-path /models/DeepSeek-V3 --tp-size 8 "
        "--speculative-algorithm NEXTN --speculative-num-steps 5",
    )
    _, space, _ = init.load()
    mtp = space["parameters"]["mtp"]
    assert space["baseline"]["mtp"] == "current"
    assert mtp["target"]["map"]["current"] == {
        "flags": {"--speculative-algorithm": "NEXTN", "--speculative-num-steps": "5"}
    }


def test_an_engine_without_a_known_lever_is_a_clear_error(init: Init) -> None:
    result = init("--from-command", "./server --port 9000", "--health", "/ok", ok=False)
    assert result.exit_code == 2
    assert "no lever autotune knows applies" in result.output
    assert not init.files()[0].exists()


def test_the_study_measures_throughput_with_text_prompts(init: Init) -> None:
    init("--from-command", "vllm serve /m", "--concurrency", "8", "--requests", "40")
    _, _, study = init.load()
    assert study["objective"] == "throughput"
    assert study["load"]["concurrency"] == 8 and study["load"]["requests"] == 40
    assert study["load"]["prompt"] == "text"
    yaml.safe_dump(study)  # plain data
