"""The tuning loop end to end: real simulated servers on loopback, real load, SQLite."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_helpers import E2E_STUDY, FAST_CONFIG, REPO, autotune_cli, load
from optuna.trial import TrialState
from systemd_verify import SYSTEMD_ANALYZE, verify

from autotune.space import load_space
from autotune.study.definition import load_study_definition
from autotune.study.runner import Tuner

pytestmark = pytest.mark.slow


def _params(space_path: Path, config: dict[str, object]) -> dict[str, object]:
    space = load_space(space_path)
    names = {p.name for p in space.sampled_params}
    return {k: v for k, v in config.items() if k in names}


def test_failures_are_infeasible_with_reason_and_duplicates_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    definition = load_study_definition(E2E_STUDY)
    db = tmp_path / "loop.db"
    tuner = Tuner(definition=definition, study_name="loop", storage_url=f"sqlite:///{db}", seed=3)
    space_path = definition.resolve(definition.space)
    fast = _params(space_path, FAST_CONFIG)
    oom = {
        **fast,
        "speculative": "eagle",
        "speculative_num_steps": 4,
        "mem_fraction_static": 0.95,
        "cuda_graph_max_bs_decode": 256,
    }
    forbidden = {**fast, "moe_runner_backend": "flashinfer_cutlass", "checkpoint": "mxfp4"}
    wrong = {**fast, "nccl_proto": "LL128", "pcie_ipc_allreduce": False}
    study = tuner.study
    # No baseline in this test: the first trial (fast) defines the reference output.
    study.enqueue_trial(fast)
    for params in (oom, forbidden, wrong, fast):
        study.enqueue_trial(params)
    tuner._enqueue_baseline = lambda: None  # type: ignore[method-assign]
    started = time.monotonic()
    summary = tuner.run(n_trials=5)
    assert summary.trials_total == 5 and not summary.interrupted
    trials = load("loop", db).get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 5
    ok, oom_t, forb_t, wrong_t, dup_t = trials

    assert ok.user_attrs["failure"] is None
    # the baseline at this load shape is ~10 tok/s; the model gives this config 126 tok/s, but
    # with 6-token outputs a request is mostly its hops (router, the decode's KV hand-over
    # from the prefill), which a busy 2-core machine stretches: 49-60 tok/s measured
    assert ok.values[0] > 30
    named = {k: v for k, v in ok.constraints.items() if not k.isdigit()}
    assert named == {"feasible": 0.0, "slo_error_rate": 0.0}
    assert set(ok.user_attrs["phase_seconds"]) >= {"restart", "warmup", "measure", "tuner"}
    assert set(ok.user_attrs["services"]) == {"prefill", "decode", "router"}
    assert (
        "--moe-runner-backend flashinfer_cutlass" in ok.user_attrs["services"]["decode"]["command"]
    )
    assert ok.user_attrs["metrics"]["completed"] == 8
    assert ok.user_attrs["effective"]["decode"]  # /server_info was read
    assert ok.system_attrs["constraints"] == [0.0, 0.0]  # for optuna-dashboard

    assert oom_t.user_attrs["failure"] == "cuda_oom"
    assert "out of memory" in oom_t.user_attrs["log_tail"].lower()
    assert oom_t.values == [0.0] and oom_t.constraints["feasible"] == 1.0
    assert oom_t.user_attrs["phase_seconds"]["restart"] < 15  # failed fast, not at the 60 s timeout

    assert forb_t.user_attrs["failure"] == "forbidden"
    assert "flashinfer_cutlass" in forb_t.user_attrs["reason"]
    assert forb_t.user_attrs["phase_seconds"]["restart"] == 0.0  # never launched

    assert wrong_t.user_attrs["failure"] == "wrong_output"
    assert wrong_t.constraints["feasible"] == 1.0

    assert dup_t.user_attrs["reused_from"] == ok.number
    assert dup_t.values == ok.values
    assert dup_t.user_attrs["phase_seconds"]["measure"] == 0.0
    # the original's start-up stages stay with it: the copy started nothing
    assert ok.user_attrs["startup"]["decode"]["stages"]
    assert not dup_t.user_attrs.get("startup")
    assert time.monotonic() - started < 120
    # Services were stopped at the end: the ports the launcher used are free again.
    state = tmp_path / "studies" / "runs"
    assert not list(state.rglob("state.json"))


def test_cli_run_resume_best_export_report(tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    common = ["--study", "cli", "--storage", f"sqlite:///{db}", "--study-file", str(E2E_STUDY)]
    first = autotune_cli("run", "--trials", "2", "--seed", "7", *common, cwd=tmp_path)
    assert "trial 1/2 (#0)" in first.stdout
    study = load("cli", db)
    trials = study.get_trials()
    assert len(trials) == 2
    baseline = trials[0]
    space = load_space(REPO / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml")
    assert baseline.user_attrs["is_baseline"] is True
    assert baseline.params == space.baseline_params()
    assert baseline.user_attrs["failure"] is None
    assert study.metric_names == ["output_throughput_tok_s"]

    autotune_cli("run", "--trials", "4", "--seed", "7", *common, cwd=tmp_path)
    trials = load("cli", db).get_trials()
    assert [t.number for t in trials] == [0, 1, 2, 3]
    assert sum(1 for t in trials if t.user_attrs.get("is_baseline")) == 1
    assert all(t.state == TrialState.COMPLETE for t in trials)
    # The resumed run (same seed, a new process) proposes new configurations, not its first
    # run's again (they would be duplicates, reused without a launch).
    assert len({json.dumps(t.params, sort_keys=True) for t in trials}) == 4

    best = autotune_cli("best", "--study", "cli", "--storage", f"sqlite:///{db}", cwd=tmp_path)
    assert "gain over baseline" in best.stdout

    out = tmp_path / "deploy"
    autotune_cli(
        "best",
        "--study",
        "cli",
        "--storage",
        f"sqlite:///{db}",
        "--export",
        "systemd",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    units = sorted((out / "units").glob("*.service"))
    assert {u.name for u in units} == {
        "autotune-prefill.service",
        "autotune-decode.service",
        "autotune-router.service",
    }
    if SYSTEMD_ANALYZE:
        for unit in units:
            result = verify(unit)
            assert result.returncode == 0, result.stderr

    as_json = autotune_cli(
        "best", "--study", "cli", "--storage", f"sqlite:///{db}", "--export", "json", cwd=tmp_path
    )
    exported = json.loads(as_json.stdout)
    assert exported["config"]

    autotune_cli(
        "report",
        "--study",
        "cli",
        "--storage",
        f"sqlite:///{db}",
        "--out",
        str(tmp_path / "r.html"),
        cwd=tmp_path,
    )
    html = (tmp_path / "r.html").read_text()
    assert "Pareto" in html and "<html" in html.lower()


def test_ctrl_c_leaves_study_consistent_and_resumable(tmp_path: Path) -> None:
    db = tmp_path / "int.db"
    common = ["--study", "int", "--storage", f"sqlite:///{db}", "--study-file", str(E2E_STUDY)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "autotune", "run", "--trials", "50", *common],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        # Wait until the baseline trial is running and its services have started.
        while time.monotonic() < deadline:
            if list((tmp_path / "studies" / "runs").rglob("decode.log")):
                break
            time.sleep(0.2)
        else:
            pytest.fail("the run never started its services")
        time.sleep(1.0)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        stop_seconds = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert stop_seconds < 15
    assert "Resume with the same command" in err
    study = load("int", db)
    states = [t.state for t in study.get_trials()]
    assert TrialState.RUNNING not in states
    interrupted = [t for t in study.get_trials() if t.state == TrialState.FAIL]
    assert len(interrupted) == 1 and interrupted[0].user_attrs["failure"] == "interrupted"
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert len(waiting) == 1 and waiting[0].system_attrs["fixed_params"] == interrupted[0].params
    assert not list((tmp_path / "studies" / "runs").rglob("state.json"))  # nothing left running

    autotune_cli("run", "--trials", "1", *common, cwd=tmp_path)
    study = load("int", db)
    done = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(done) == 1
    assert done[0].user_attrs["retry_of"] == interrupted[0].number
    assert done[0].user_attrs["is_baseline"] is True
