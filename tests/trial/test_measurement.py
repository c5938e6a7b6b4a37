"""A trial's measurement plans on the simulated deployment: capacity, curve, goodput.

One set of running processes serves every plan (the launcher keeps them: the config never
changes), so the module starts the simulated deployment once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from trial_helpers import Reference

from autotune.deployment import load_deployment
from autotune.engines import get_engine
from autotune.launch import LocalLauncher
from autotune.loadgen import SLO, LoadSpec
from autotune.loadgen.capacity import CapacitySearch, SweepSpec
from autotune.space import load_space
from autotune.study.definition import SLOSettings
from autotune.study.objectives import Objective
from autotune.trial import MeasurePlan, PipelineSettings, TrialPipeline

REPO = Path(__file__).resolve().parents[2]
SPACE = REPO / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml"
SIM = REPO / "launchers" / "sim-dsv4-flash-pd.yaml"
DEPLOYMENT = load_deployment(SIM)  # one: its free ports are chosen once per deployment
SPEEDUP = DEPLOYMENT.sim_speedup
# Fast on the twin: no speculation, nvfp4 with the flashinfer kernels (TPOT ~10 ms modeled).
CONFIG = {
    "speculative": "off",
    "checkpoint": "nvfp4",
    "moe_runner_backend": "flashinfer_cutlass",
    "sm120_flashmla_backend": "flashinfer",
    "sm120_direct_swa_kv": True,
}
SLO_MS = {"ttft_p99_ms": 4000.0, "tpot_p99_ms": 80.0}


RUN_DIR: list[Path] = []


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalLauncher]:
    pytest.importorskip("sglang_router")
    run_dir = tmp_path_factory.mktemp("run")
    RUN_DIR[:] = [run_dir]
    with LocalLauncher(run_dir, stop_grace_s=5.0) as running:
        yield running


def pipeline(launcher: LocalLauncher, kind: str, plan: MeasurePlan, **load: Any) -> TrialPipeline:
    space = load_space(SPACE)
    wall = SLO(**{k.replace("_p99", ""): v / SPEEDUP for k, v in SLO_MS.items()})
    spec = {
        "concurrency": 4,
        "warmup_requests": 2,
        "requests": None,
        "duration_s": 1.0,
        "max_duration_s": 20,
        "dataset": {
            "kind": "shared_prefix",
            "groups": 4,
            "prompts_per_group": 8,
            "system_prompt_len": 512,
            "question_len": 32,
            "output_len": 32,
        },
        "model": "deepseek-ai/DeepSeek-V4-Flash",
        "prompt": "text",  # the router takes text prompts (the engine's request quirk)
        "slo": wall,
        **load,
    }
    return TrialPipeline(
        space=space,
        deployment=DEPLOYMENT,
        launcher=launcher,
        scorer=Objective(kind=kind, slo=SLOSettings(**SLO_MS)),
        load=LoadSpec.model_validate(spec),
        settings=PipelineSettings(trial_timeout_s=300.0),
        reference=Reference(),
        engines={s: get_engine("sglang") for s in space.services},
        run_dir=RUN_DIR[0],
        plan=plan,
    )


def config(p: TrialPipeline) -> dict[str, Any]:
    params: dict[str, object] = dict(p.space.baseline_params())
    params.update(CONFIG)
    return p.space.complete(params)


def test_a_capacity_trial_stores_its_search_and_curve(launcher: LocalLauncher) -> None:
    search = CapacitySearch(start=0.5, precision=0.3, budget_s=60)
    p = pipeline(launcher, "capacity_vs_tpot", MeasurePlan(capacity=search))
    outcome = p.evaluate(config(p))
    record = outcome.record
    assert outcome.failure is None, record.reason
    cap = record.capacity
    assert cap is not None and cap["over"] == "rate" and cap["capacity"] > 0
    assert outcome.values[0] == cap["capacity"]  # modeled req/s
    assert outcome.values[1] == record.metrics["tpot_ms"]["p99"]
    xs = [pt["x"] for pt in record.curve]
    assert xs == sorted(xs) and len(xs) == cap["probes"]
    assert cap["capacity"] in xs and 0.5 in xs  # rates of the modeled hardware
    # The verdict at capacity is its last measurement: a failing first one is confirmed
    # (re-measured) before it bounds the search, and the curve keeps both, in order.
    at_capacity = [pt for pt in record.curve if pt["x"] == cap["capacity"]]
    at = at_capacity[-1]
    assert at["ok"] and at["tpot_p99"] <= SLO_MS["tpot_p99_ms"]
    assert [pt["retry"] for pt in at_capacity] == list(range(len(at_capacity)))
    assert all(not pt["ok"] for pt in at_capacity[:-1])
    above = [pt for pt in record.curve if pt["x"] > cap["capacity"]]
    assert all(not pt["ok"] and pt["violations"] for pt in above)
    assert outcome.feasible  # measured at capacity: every SLO holds there
    assert record.stop_reason and record.stop_reason.startswith("capacity search")


def test_a_goodput_trial_counts_requests_within_the_slos(launcher: LocalLauncher) -> None:
    p = pipeline(launcher, "goodput", MeasurePlan(), request_rate=0.5 * SPEEDUP)
    outcome = p.evaluate(config(p))
    m = outcome.record.metrics
    assert outcome.failure is None, outcome.record.reason
    # Kept from the capacity trial: their prefix caches were emptied first (the router has
    # no cache of its own), so this trial's shared prefixes start uncached like a restart's.
    assert outcome.record.restarted == []
    assert outcome.record.cache_flushed == ["decode", "prefill"]
    assert outcome.values == [m["goodput"]]
    assert 0 < m["goodput"] <= m["request_throughput"] + 1e-9
    assert m["arrival_rate"] is not None  # an open loop
    assert m["send_lag_ms"]["p50"] is not None


def test_a_curve_is_a_sweep_on_the_same_processes(launcher: LocalLauncher) -> None:
    curve = SweepSpec(over="concurrency", points=[1, 4])
    p = pipeline(launcher, "throughput", MeasurePlan(curve=curve), duration_s=None, requests=8)
    outcome = p.evaluate(config(p))
    record = outcome.record
    assert outcome.failure is None, record.reason
    assert record.restarted == []  # the processes of the trials before
    assert [pt["x"] for pt in record.curve] == [1, 4]
    low, high = record.curve
    assert high["output_throughput"] > 1.5 * low["output_throughput"]
    assert record.capacity is None and outcome.values == [record.metrics["output_throughput"]]
