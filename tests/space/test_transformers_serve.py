"""The bundled `transformers serve` space, deployment and H200 studies."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from space_fixtures import ROOT

from autotune.deployment import Deployment, load_deployment
from autotune.render import render
from autotune.space import SearchSpace, TrialConfig, load_space
from autotune.study.definition import load_study_definition
from autotune.study.runner import Tuner

SPACE = ROOT / "search_spaces" / "transformers-serve.yaml"
DEPLOYMENT = ROOT / "launchers" / "transformers-serve-local.yaml"
STUDIES = [
    ROOT / "studies" / "transformers-serve-h200.yaml",
    ROOT / "studies" / "transformers-serve-h200-check.yaml",
]

# The configuration of the device run and the flags it rendered there.
DEVICE_CONFIG: dict[str, object] = {
    "continuous_batching": True,
    "attn_implementation": "eager",
    "dtype": "auto",
    "cb_cuda_graph": True,
    "cb_block_size": 256,
    "cb_kv_manual": True,
    "cb_kv_tokens": 4621,
    "cb_max_batch_tokens": 256,
    "cb_max_memory_percent": 0.8,
}
DEVICE_RUN = (
    "--attn-implementation eager --cb-block-size 256 --cb-max-batch-tokens 256 "
    "--cb-max-memory-percent 0.8 --cb-num-blocks 18 --cb-use-cuda-graph --continuous-batching"
)
DEVICE_FLAGS = DEVICE_RUN.split()


@pytest.fixture(scope="module")
def space() -> SearchSpace:
    return load_space(SPACE)


@pytest.fixture(scope="module")
def deployment() -> Deployment:
    return load_deployment(DEPLOYMENT)


def _argv(
    space: SearchSpace, deployment: Deployment, config: TrialConfig, run_dir: Path
) -> list[str]:
    (spec,) = render(space, deployment, config, run_dir=run_dir).values()
    assert spec.name == "serve"
    return list(spec.argv)


def _lever_flags(argv: list[str]) -> list[str]:
    """The tokens after the deployment's own command (`... --log-level info`)."""
    at = argv.index("--log-level")
    assert argv[at + 1] == "info"
    return argv[at + 2 :]


def _flag_names(argv: list[str]) -> set[str]:
    return {t for t in argv if t.startswith("--")}


def test_services_and_levers(space: SearchSpace) -> None:
    assert space.services == ("serve",)
    assert space.parameter("cb_num_blocks").sampled is False  # derived
    assert {p.name for p in space.sampled_params} == {
        "continuous_batching",
        "attn_implementation",
        "compile",
        "dtype",
        "cb_cuda_graph",
        "cb_block_size",
        "cb_kv_manual",
        "cb_kv_tokens",
        "cb_max_batch_tokens",
        "cb_max_memory_percent",
    }


def test_baseline_renders_no_lever_flag(
    space: SearchSpace, deployment: Deployment, tmp_path: Path
) -> None:
    baseline = space.baseline_config()
    assert baseline["continuous_batching"] is False
    assert not any(name.startswith("cb_") for name in baseline)  # inactive without CB
    argv = _argv(space, deployment, baseline, tmp_path)
    assert _lever_flags(argv) == []
    assert "--continuous-batching" not in argv
    assert not [t for t in argv if t.startswith(("--cb-", "--no-cb-"))]
    # The model is the positional argument, before the first --flag.
    assert argv[argv.index("serve") + 1] == "/tmp/autotune-model"
    assert not space.violations(baseline)


def test_device_run_config_renders_exactly_its_flags(
    space: SearchSpace, deployment: Deployment, tmp_path: Path
) -> None:
    config = space.complete(DEVICE_CONFIG)
    assert config["cb_num_blocks"] == 4621 // 256 == 18
    assert "compile" not in config  # only a lever without continuous batching
    assert not space.violations(config)
    settings = space.settings_for("serve", config)
    assert settings.flags == {
        "--continuous-batching": None,
        "--attn-implementation": "eager",
        "--cb-use-cuda-graph": None,
        "--cb-block-size": "256",
        "--cb-num-blocks": "18",
        "--cb-max-batch-tokens": "256",
        "--cb-max-memory-percent": "0.8",
    }
    assert not settings.env and not settings.unset_env
    assert _lever_flags(_argv(space, deployment, config, tmp_path)) == DEVICE_FLAGS


def test_cuda_graph_off_is_an_explicit_switch(
    space: SearchSpace, deployment: Deployment, tmp_path: Path
) -> None:
    config = space.complete({**DEVICE_CONFIG, "cb_cuda_graph": False})
    flags = _lever_flags(_argv(space, deployment, config, tmp_path))
    assert "--no-cb-use-cuda-graph" in flags
    assert "--cb-use-cuda-graph" not in flags
    assert "--continuous-batching" in flags


def test_automatic_kv_sizing_and_defaults_render_no_flag(
    space: SearchSpace, deployment: Deployment, tmp_path: Path
) -> None:
    config = space.complete(
        {
            **DEVICE_CONFIG,
            "cb_kv_manual": False,
            "cb_max_batch_tokens": "auto",
            "attn_implementation": "default",
            "dtype": "bfloat16",
        }
    )
    assert "cb_kv_tokens" not in config and "cb_num_blocks" not in config
    flags = _lever_flags(_argv(space, deployment, config, tmp_path))
    assert "--cb-num-blocks" not in flags
    assert "--cb-max-batch-tokens" not in flags  # auto = flag absent
    assert "--attn-implementation" not in flags  # default = flag absent
    assert flags[flags.index("--dtype") + 1] == "bfloat16"


def test_compile_without_continuous_batching(
    space: SearchSpace, deployment: Deployment, tmp_path: Path
) -> None:
    config = space.complete({**space.baseline_params(), "compile": True})
    assert _lever_flags(_argv(space, deployment, config, tmp_path)) == ["--compile"]


def test_flex_attention_with_continuous_batching_is_forbidden(space: SearchSpace) -> None:
    flex = {**DEVICE_CONFIG, "attn_implementation": "flex_attention"}
    assert [v.name for v in space.violations(flex)] == ["flex_attention_has_no_paged_kernel"]
    assert "paged" in space.violations(flex)[0].reason
    for attn in ("default", "sdpa", "eager"):
        assert not space.violations({**DEVICE_CONFIG, "attn_implementation": attn}), attn
    # Without continuous batching flex_attention is allowed.
    without_cb = {**space.baseline_params(), "attn_implementation": "flex_attention"}
    assert not space.violations(without_cb)


def test_random_configs_never_pass_cb_flags_without_continuous_batching(
    space: SearchSpace, deployment: Deployment, tmp_path: Path
) -> None:
    rng = random.Random(11)
    seen = {"cb": 0, "plain": 0, "compile": 0, "flex_cb": 0}
    for _ in range(300):
        config = space.random_config(rng)
        argv = _argv(space, deployment, config, tmp_path)
        names = _flag_names(argv)
        cb_flags = {n for n in names if n.startswith(("--cb-", "--no-cb-"))}
        if "--continuous-batching" in names:
            seen["cb"] += 1
            assert "--compile" not in names, config
            assert {"--cb-use-cuda-graph", "--no-cb-use-cuda-graph"} & names, config
            if config["cb_kv_manual"]:
                n_blocks = argv[argv.index("--cb-num-blocks") + 1]
                tokens, block = config["cb_kv_tokens"], config["cb_block_size"]
                assert isinstance(tokens, int) and isinstance(block, int)
                assert int(n_blocks) == tokens // block
            if config["attn_implementation"] == "flex_attention":
                seen["flex_cb"] += 1
                assert space.violations(config), config
        else:
            seen["plain"] += 1
            seen["compile"] += "--compile" in names
            assert not cb_flags, config
    assert all(seen.values()), seen  # every branch was drawn
    for _ in range(100):
        config = space.random_config(rng, avoid_forbidden=True)
        if config["continuous_batching"]:
            assert config["attn_implementation"] != "flex_attention"


def test_deployment(deployment: Deployment) -> None:
    assert deployment.name == "transformers-serve-local"
    assert deployment.model == "/tmp/autotune-model"
    assert list(deployment.services) == ["serve"]
    serve = deployment.services["serve"]
    assert serve.env["TORCH_LOGS"] == "dynamo"
    assert serve.env["HF_HUB_OFFLINE"] == "1" and serve.env["PYTHONUNBUFFERED"] == "1"
    command = serve.command
    # The model is positional and comes before the first --flag (render edits from there).
    assert command.index("${model}") < min(i for i, t in enumerate(command) if t.startswith("--"))


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_h200_studies_load(path: Path) -> None:
    definition = load_study_definition(path)
    assert definition.resolve(definition.space) == SPACE.resolve()
    assert definition.resolve(definition.deployment) == DEPLOYMENT.resolve()
    load = definition.load
    assert load.ignore_eos is None  # transformers serve refuses unknown request fields
    assert load.require_done is False  # its streams end without data: [DONE]
    assert load.prompt == "text"
    assert (load.concurrency, load.input_len, load.output_len) == (16, 128, 128)
    # A stalled first request must end the warm-up by max_duration_s (a BenchTimeout, which
    # makes the runner look for torch.compile in the log), not by a request timeout.
    assert load.request_timeout_s > load.max_duration_s
    assert definition.correctness.enabled is False
    assert definition.trial_timeout_s >= load.max_duration_s


def test_h200_study_settings_reach_the_load_generator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    tuner = Tuner(
        definition=load_study_definition(STUDIES[0]),
        study_name="tf",
        storage_url=f"sqlite:///{tmp_path / 'tf.db'}",
    )
    spec = tuner._load_spec()
    assert spec.prompt == "text"
    assert spec.ignore_eos is None and spec.require_done is False
    assert spec.model == "/tmp/autotune-model"  # never asks /v1/models (it lists the HF cache)
    assert (spec.max_duration_s, spec.request_timeout_s) == (60, 90)
