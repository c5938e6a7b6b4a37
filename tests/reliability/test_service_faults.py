"""Service faults seen by the tuning loop: a real misbehaving server per trial.

tests/faults/faulty_server.py answers the correctness probe, the warm-up and the first
measured requests, then breaks in one of its modes (crash, hang, drip, HTTP errors, error
events, malformed or wrongly shaped events, resets, garbage). Every faulty trial must end
within the study's deadline, be recorded infeasible with a reason, and the healthy trial
after it must run on a fresh process and measure normally.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import yaml
from e2e_helpers import REPO
from optuna.trial import TrialState

from autotune.results import feasible
from autotune.study.definition import load_study_definition
from autotune.study.runner import Tuner

DATA = Path(__file__).parent / "data"
FAULTY_SERVER = REPO / "tests" / "faults" / "faulty_server.py"
FAULTS = [
    "crash", "hang", "hang_all", "stall_mid_stream", "drip", "http_500", "http_429",
    "error_event", "malformed", "bad_shape", "no_done", "reset", "slow_headers", "garbage",
]  # fmt: skip
DEADLINE_S = 8.0  # trial_timeout_s of faulty-study.yaml
SLACK_S = 4.0  # stopping the service and storing the trial


def _study(tmp_path: Path) -> Path:
    shutil.copy(DATA / "faulty-space.yaml", tmp_path)
    shutil.copy(DATA / "faulty-study.yaml", tmp_path)
    deployment = {
        "name": "faulty",
        "endpoint": "http://${server.host}:${server.port}",
        "model": "faulty-model",
        "run_dir": "studies/runs/${deployment}",
        "services": {
            "server": {
                "command": [
                    "${python}",
                    str(FAULTY_SERVER),
                    "--host",
                    "${host}",
                    "--port",
                    "${port}",
                    "--fault-after",
                    "7",
                ],  # fmt: skip
                "port": "auto",
                "health": {"url": "http://${host}:${port}/health", "timeout_s": 30},
                "log_file": "${run_dir}/server.log",
            }
        },
    }
    (tmp_path / "faulty-deployment.yaml").write_text(yaml.safe_dump(deployment))
    return tmp_path / "faulty-study.yaml"


def _tuner(tmp_path: Path) -> Tuner:
    return Tuner(
        definition=load_study_definition(_study(tmp_path)),
        study_name="faults",
        storage_url=f"sqlite:///{tmp_path / 'faults.db'}",
    )


def test_each_fault_is_infeasible_with_reason_and_next_trial_is_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    tuner = _tuner(tmp_path)
    plan = [{"fault": "ok", "slow_start": False, "tag": 0}]
    for i, fault in enumerate(FAULTS, start=1):
        plan.append({"fault": fault, "slow_start": False, "tag": i})
        plan.append({"fault": "ok", "slow_start": False, "tag": i})
    for params in plan:
        tuner.study.enqueue_trial(params)
    summary = tuner.run(n_trials=len(plan))
    assert summary.trials_total == len(plan) and not summary.left_running

    trials = tuner.study.get_trials(states=(TrialState.COMPLETE,))
    assert [t.params for t in trials] == plan
    report = []
    for t in trials:
        attrs = t.user_attrs
        seconds = attrs["phase_seconds"]["total"]
        report.append((attrs["config"]["fault"], attrs["failure"], round(seconds, 1)))
        if attrs["config"]["fault"] == "ok":
            assert attrs["failure"] is None and feasible(t), attrs.get("reason")
            assert attrs["metrics"]["completed"] == 12 and attrs["metrics"]["failed"] == 0
            assert attrs["restarted"] == ["server"], "a healthy trial reused a faulty process"
        else:
            assert not feasible(t)
            assert attrs["failure"] in {"crashed", "bench_failed", "request_errors"}, attrs
            assert attrs["reason"], attrs
            assert seconds < DEADLINE_S + SLACK_S, (attrs["config"], seconds)
    by_fault = {fault: failure for fault, failure, _ in report}
    assert by_fault["crash"] == "crashed"
    for t in trials:
        a = t.user_attrs
        print(
            f"{a['config']['fault']:>16} {a['failure']!s:>14} {a['phase_seconds']['total']:5.1f}s "
            f"{(a['reason'] or '')[:150]}"
        )


def test_trial_deadline_caps_a_service_that_never_becomes_healthy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    tuner = _tuner(tmp_path)
    tuner.study.enqueue_trial({"fault": "ok", "slow_start": False, "tag": 0})
    tuner.study.enqueue_trial({"fault": "ok", "slow_start": True, "tag": 1})
    tuner.study.enqueue_trial({"fault": "ok", "slow_start": False, "tag": 2})
    t0 = time.monotonic()
    tuner.run(n_trials=3)
    assert time.monotonic() - t0 < 3 * DEADLINE_S
    first, slow, after = tuner.study.get_trials(states=(TrialState.COMPLETE,))
    assert slow.user_attrs["failure"] == "trial_timeout"
    assert "deadline" in slow.user_attrs["reason"]
    assert DEADLINE_S - 0.5 < slow.user_attrs["phase_seconds"]["restart"] < DEADLINE_S + SLACK_S
    assert after.user_attrs["failure"] is None and feasible(after)
    assert first.user_attrs["failure"] is None
