"""The trial pipeline on its own: a configuration in, a scored record out, no Optuna."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from trial_helpers import Reference

from autotune.deployment import load_deployment
from autotune.engines import get_engine
from autotune.errors import LaunchError
from autotune.launch import LocalLauncher
from autotune.loadgen import LoadSpec
from autotune.space import load_space
from autotune.specs import ServiceSpec
from autotune.study.definition import SLOSettings
from autotune.study.objectives import Objective
from autotune.trial import (
    SCHEMA_VERSION,
    HostFailure,
    PipelineSettings,
    TrialOutcome,
    TrialPipeline,
)

REPO = Path(__file__).resolve().parents[2]
SPACE = REPO / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml"
SIM = REPO / "launchers" / "sim-dsv4-flash-pd.yaml"
OBJECTIVE = Objective(kind="throughput", slo=SLOSettings())


class FailingLauncher:
    """Duck-typed launcher whose every apply fails with ``failure``."""

    def __init__(self, failure: str) -> None:
        self.failure = failure
        self.applied = 0

    def apply(self, specs: Mapping[str, ServiceSpec], **_: Any) -> Any:
        self.applied += 1
        stages = {"stages": [{"stage": "capturing CUDA graphs", "at_s": 30.0}], "failed_s": 31.5}
        raise LaunchError(
            "CUDA out of memory",
            service="decode",
            failure=self.failure,
            log_tail="OOM here",
            startup=stages,
        )

    def stop_all(self) -> None:
        pass


def _pipeline(tmp_path: Path, launcher: Any, **load: Any) -> TrialPipeline:
    space = load_space(SPACE)
    spec = {"concurrency": 4, "input_len": 64, "output_len": 16, "requests": 8, "prompt": "text"}
    return TrialPipeline(
        space=space,
        deployment=load_deployment(SIM),
        launcher=launcher,
        scorer=OBJECTIVE,
        load=LoadSpec.model_validate({**spec, **load, "model": "deepseek-ai/DeepSeek-V4-Flash"}),
        settings=PipelineSettings(trial_timeout_s=120.0),
        reference=Reference(),
        engines={s: get_engine("sglang") for s in space.services},
        run_dir=tmp_path / "run",
    )


def test_the_trial_package_imports_no_optuna() -> None:
    code = "import sys, autotune.trial; print('optuna' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_forbidden_config_is_an_outcome_and_launches_nothing(tmp_path: Path) -> None:
    launcher = FailingLauncher("cuda_oom")
    pipeline = _pipeline(tmp_path, launcher)
    config = dict(pipeline.space.baseline_config())
    config.update(moe_runner_backend="flashinfer_mxfp4", checkpoint="nvfp4")
    outcome = pipeline.evaluate(pipeline.space.complete(config))
    assert launcher.applied == 0
    assert outcome.failure == "forbidden" and not outcome.feasible
    assert outcome.record.reason is not None
    assert outcome.record.violations and outcome.record.violations[0] in outcome.record.reason
    assert outcome.values == OBJECTIVE.failed_values()
    assert outcome.record.services == {}  # never rendered


def test_a_failed_launch_keeps_its_class_reason_and_log(tmp_path: Path) -> None:
    launcher = FailingLauncher("cuda_oom")
    pipeline = _pipeline(tmp_path, launcher)
    outcome = pipeline.evaluate(pipeline.space.baseline_config(), is_baseline=True)
    record = outcome.record
    assert launcher.applied == 1
    assert (record.failure, record.reason, record.log_tail) == (
        "cuda_oom",
        "decode: CUDA out of memory",
        "OOM here",
    )
    assert record.is_baseline and set(record.services) == {"prefill", "decode", "router"}
    assert record.phase_seconds["restart"] >= 0.0 and "measure" in record.phase_seconds
    # where the failed start got to, for the report's start-up table
    assert record.startup["decode"].spans()[-1] == ("capturing CUDA graphs", 1.5)
    stored = outcome.attrs
    assert stored["schema_version"] == SCHEMA_VERSION and stored["failure"] == "cuda_oom"
    assert "metrics" not in stored  # nothing was measured


def test_an_unreachable_host_is_not_a_property_of_the_config(tmp_path: Path) -> None:
    pipeline = _pipeline(tmp_path, FailingLauncher("host_unreachable"))
    with pytest.raises(HostFailure, match="CUDA out of memory"):
        pipeline.evaluate(pipeline.space.baseline_config())


def test_the_simulated_deployment_end_to_end_without_a_study(tmp_path: Path) -> None:
    pytest.importorskip("sglang_router")
    with LocalLauncher(tmp_path / "run", stop_grace_s=5.0) as launcher:
        pipeline = _pipeline(tmp_path, launcher)
        config = dict(pipeline.space.baseline_params())
        config.update(speculative="off")
        first = pipeline.evaluate(pipeline.space.complete(config))
        assert first.failure is None, first.record.reason
        assert isinstance(first, TrialOutcome) and first.feasible
        assert first.values[0] == pytest.approx(first.record.metrics["output_throughput"])
        assert first.record.metrics["completed"] == 8
        assert first.record.restarted == ["prefill", "decode", "router"]
        # each worker's start-up stages as its log printed them (SGLang's lines); the router
        # prints none: one span from its start to healthy
        for worker in ("prefill", "decode"):
            startup = first.record.startup[worker]
            assert [m.stage for m in startup.stages][:2] == [
                "loading the weights",
                "starting up after the KV cache was allocated",
            ], startup
            assert startup.ready_s is not None and startup.ready_s >= startup.stages[-1].at_s
        assert first.record.startup["router"].stages == []
        assert first.record.effective["decode"]["tp_size"] == 4
        assert first.record.engine_version == {"prefill": "0.5.23", "decode": "0.5.23"}
        assert pipeline.reference.get()  # the first healthy trial set it
        again = pipeline.evaluate(pipeline.space.complete(config))
        assert again.failure is None and again.record.restarted == []
        assert again.record.startup == {}  # nothing started: nothing timed
        assert again.record.cache_flushed == []  # random prompts: nothing a cache could serve


def test_the_servers_own_counters_are_stored_for_the_measured_phase(tmp_path: Path) -> None:
    """The simulated SGLang workers export ``sglang:`` metrics: the window's counters hold
    exactly the measured requests (the warm-up and the probe ran before it began)."""
    pytest.importorskip("sglang_router")
    with LocalLauncher(tmp_path / "run", stop_grace_s=5.0) as launcher:
        pipeline = _pipeline(tmp_path, launcher, warmup_requests=4)
        outcome = pipeline.evaluate(pipeline.space.baseline_config(), is_baseline=True)
    assert outcome.failure is None, outcome.record.reason
    server = outcome.record.server_metrics
    assert set(server) == {"prefill", "decode"}  # the router has no engine metrics here
    decode = server["decode"]
    assert decode["e2e_count"] == 8  # 8 measured requests; not the 4 of the warm-up
    assert 0 < decode["generation_tokens"] <= 8 * 16
    assert decode["e2e_mean_s"] > 0 and decode["kv_usage_max"] >= 0
    assert outcome.attrs["server_metrics"]["decode"]["e2e_count"] == 8
