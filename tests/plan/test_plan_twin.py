"""``autotune plan`` on the twin: a capacity study of the bundled simulated deployment (real
simulated servers behind the real sglang-router, loopback, SQLite), planned for a target rate.

The study is the bundled capacity study's, made small: its space, its deployment (8 GPUs in
``gpus:``), its SLOs and shared-prefix workload, three trials (the baseline, whose TPOT
breaks the SLO at any rate, and two fast configurations), the winner re-measured twice so
that its lower bound differs from its mean.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import REPO, autotune_cli, load

from autotune.results import config_estimates

STUDY = "plantwin"
FAST = (
    "{speculative: 'off', checkpoint: nvfp4, moe_runner_backend: flashinfer_cutlass, "
    "sm120_flashmla_backend: flashinfer, sm120_direct_swa_kv: true"
)
TARGET, HEADROOM = 10.0, 0.25


def _study_file(path: Path) -> Path:
    path.write_text(
        f"name: {STUDY}\n"
        f"space: {REPO / 'search_spaces' / 'dsv4-flash-rtx6000-pd.yaml'}\n"
        f"deployment: {REPO / 'launchers' / 'sim-dsv4-flash-pd.yaml'}\n"
        "objective: capacity\nsampler: tpe\n"
        "load:\n"
        "  dataset: {kind: shared_prefix, groups: 4, prompts_per_group: 8,\n"
        "            system_prompt_len: 512, question_len: 32, output_len: 32}\n"
        "  concurrency: 4\n  warmup_requests: 2\n  requests: null\n  duration_s: 1\n"
        "  max_duration_s: 20\n  request_timeout_s: 60\n"
        "capacity: {over: rate, start: 2.0, precision: 0.3, budget_s: 12}\n"
        "slo: {ttft_p99_ms: 3000, tpot_p99_ms: 60, max_error_rate: 0.0}\n"
        "remeasure: {policy: fixed, top_k: 1, repeats: 2}\n"
        "correctness: {max_tokens: 3}\n"
        "enqueue:\n"
        f"  - {FAST}}}\n"
        f"  - {FAST}, mem_fraction_static: 0.8, max_running_requests: 16}}\n"
    )
    return path


@dataclass
class Twin:
    root: Path
    db: Path

    def plan(self, *args: str, check: bool = True) -> Any:
        return autotune_cli(
            "plan",
            "--study",
            STUDY,
            "--storage",
            f"sqlite:///{self.db}",
            "--target-rate",
            f"{TARGET:g}",
            "--headroom",
            f"{100 * HEADROOM:g}%",
            *args,
            cwd=self.root,
            check=check,
        )


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Twin:
    pytest.importorskip("sglang_router")
    root = tmp_path_factory.mktemp("plantwin")
    db = root / "plan.db"
    study_file = _study_file(root / f"{STUDY}.yaml")
    autotune_cli(
        "run",
        "--trials",
        "3",
        "--seed",
        "1",
        "--study",
        STUDY,
        "--storage",
        f"sqlite:///{db}",
        "--study-file",
        str(study_file),
        cwd=root,
        timeout=600,
    )
    return Twin(root=root, db=db)


def test_the_plan_of_a_capacity_study_on_the_twin(twin: Twin) -> None:
    data = json.loads(twin.plan("--gpu-hour-cost", "2.5", "--json").stdout)
    study = load(STUDY, twin.db)
    estimates = {e.trial.number: e for e in config_estimates(study)}
    rows = data["rows"]
    assert rows and rows[0]["label"] == "winner"
    assert data["provisioned_rate"] == pytest.approx(TARGET * (1 + HEADROOM))
    for r in rows:
        e = estimates[r["trial"]]
        # Replicas from the capacity's lower 95% bound, not its mean.
        assert r["rate_lower"] == pytest.approx(e.lower) and r["rate_mean"] == pytest.approx(e.mean)
        assert r["replicas"] == math.ceil(TARGET * (1 + HEADROOM) / e.lower - 1e-9)
        assert r["gpus_per_replica"] == 8 and r["gpus"] == 8 * r["replicas"]  # the file's gpus:
        assert r["cost_per_hour"] == pytest.approx(2.5 * r["gpus"])
        tokens = e.trial.metrics["output_throughput"] / e.trial.metrics["request_throughput"]
        assert r["output_tokens_per_request"] == pytest.approx(tokens)
        assert r["cost_per_million_tokens"] == pytest.approx(
            r["cost_per_hour"] / (TARGET * tokens * 3600) * 1e6
        )
    winner = rows[0]
    assert estimates[winner["trial"]].n == 3  # its trial and two re-measurements
    assert winner["rate_lower"] < winner["rate_mean"]
    assert sum(r["cheapest"] for r in rows) == 1
    cheapest = next(r for r in rows if r["cheapest"])
    assert cheapest["gpus"] == min(r["gpus"] for r in rows)

    # The baseline breaks p99 TPOT at any rate: listed with why, never planned.
    assert 0 not in {r["trial"] for r in rows}
    baseline = [u for u in data["unplannable"] if u["label"] == "baseline"]
    assert len(baseline) == 1 and baseline[0]["trial"] == 0
    assert "no load met the SLOs" in baseline[0]["reason"]
    assert "tpot_p99" in baseline[0]["reason"]

    # The table says the same, with the cost columns.
    table = twin.plan("--gpu-hour-cost", "2.5").stdout
    assert "cost/h" in table and "(cheapest)" in table
    assert f"{TARGET:g} req/s + {100 * HEADROOM:g}% headroom = {TARGET * (1 + HEADROOM):g}" in table
    assert "0 (baseline)" in table and "no load met the SLOs" in table


def test_without_a_price_the_cost_columns_are_omitted_and_said_once(twin: Twin) -> None:
    table = twin.plan().stdout
    head = table.split("not planned")[0]
    assert "cost" not in head.split("note:")[0] and "replicas" in head
    assert table.count("No --gpu-hour-cost given: the cost columns are omitted.") == 1
    data = json.loads(twin.plan("--json").stdout)
    assert all(r["cost_per_hour"] is None for r in data["rows"])
    assert all(r["gpus"] is not None for r in data["rows"])


def test_the_report_draws_the_last_plan(twin: Twin) -> None:
    twin.plan("--gpu-hour-cost", "2.5")
    out = twin.root / "report.html"
    autotune_cli(
        "report",
        "--study",
        STUDY,
        "--storage",
        f"sqlite:///{twin.db}",
        "--out",
        str(out),
        cwd=twin.root,
    )
    raw = out.read_text(encoding="utf-8")
    start = raw.index('<section id="fleet">')
    fleet = raw[start : raw.index("</section>", start)]
    assert f"Fleet plan: {TARGET:g} req/s + {100 * HEADROOM:g}% headroom" in fleet
    assert 'id="plot-fleet"' in fleet and "(cheapest)" in fleet
    assert "Cheapest that meets the target" in fleet
    assert "0 (baseline)" in fleet  # not planned, with why
    start = raw.index('<section id="summary">')
    summary = raw[start : raw.index("</section>", start)]
    assert f"cheapest fleet for {TARGET:g} req/s + {100 * HEADROOM:g}%" in summary
    # No curve section is empty, no explanation placeholder (none was asked for).
    assert "No explanation yet" not in raw and "No trial recorded a latency" not in raw
