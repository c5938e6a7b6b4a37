"""The inherited-environment check on a real SQLite study: against the newest trial that
recorded its variables (``autotune run`` at a session's start, ``autotune status``), and a
re-measurement's own record where the trial predates the recording (the race)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from autotune.results import remeasure_key
from autotune.study.environment import EnvironmentCheck, check_environment, environment_line
from autotune.study.record import inherited_changes, remeasured_changes
from autotune.trial.record import RemeasureRecord, ServiceRecord, TrialRecord

VAR = "VLLM_WORKER_MULTIPROC_METHOD"


@pytest.fixture
def study(tmp_path: Path) -> optuna.Study:
    return optuna.create_study(
        study_name="env", storage=f"sqlite:///{tmp_path / 'env.db'}", direction="maximize"
    )


def _services(env: dict[str, str] | None) -> dict[str, ServiceRecord]:
    return {"engine": ServiceRecord(command="vllm serve m", inherited_env=env)}


def _add(study: optuna.Study, env: dict[str, str] | None, *, state: TrialState) -> int:
    attrs: dict[str, Any] = TrialRecord(config={"x": 0.5}, services=_services(env)).to_attrs()
    study.add_trial(
        create_trial(
            state=state,
            values=[1.0] if state == TrialState.COMPLETE else None,
            params={"x": 0.5},
            distributions={"x": FloatDistribution(0, 1)},
            user_attrs=attrs,
        )
    )
    return len(study.trials) - 1


def _now(env: dict[str, str] | None) -> TrialRecord:
    return TrialRecord(services=_services(env))


def test_the_newest_complete_trial_that_recorded_them_is_the_reference(
    study: optuna.Study,
) -> None:
    assert check_environment(study, _services({VAR: "fork"})) == EnvironmentCheck()
    _add(study, {VAR: "spawn"}, state=TrialState.COMPLETE)  # #0
    _add(study, {VAR: "fork"}, state=TrialState.COMPLETE)  # #1: the reference
    _add(study, None, state=TrialState.COMPLETE)  # #2: not recorded (a remote service)
    _add(study, {}, state=TrialState.FAIL)  # #3: not complete

    same = check_environment(study, _services({VAR: "fork"}))
    assert same == EnvironmentCheck(trial=1, changes=[])
    assert environment_line(same) == "as trial #1's (the variables its services inherited)"

    other = check_environment(study, _services({}))
    assert other.trial == 1 and other.changes == [f"engine: {VAR}: fork then, unset now"]
    line = environment_line(other)
    assert line.startswith("differs from trial #1's (engine: ") and "measured again" in line
    # a service that does not record (None now) is not judged
    assert check_environment(study, _services(None)) == EnvironmentCheck(trial=1, changes=[])
    assert environment_line(EnvironmentCheck(error="s.yaml: bad")).startswith("not compared")


def test_a_re_measurement_records_what_a_trial_before_schema_8_did_not(
    study: optuna.Study,
) -> None:
    """Trial #0 predates the recording; its first re-measurement forked. A later session
    that spawns is another environment for the race (the runs would be pooled), though the
    trial's own record cannot say so; reusing the trial's figure is not judged by it."""
    old = _add(study, None, state=TrialState.COMPLETE)
    assert remeasured_changes(study, old, _now({})) == []  # nothing recorded yet
    again = RemeasureRecord(of=old, repeat=1, inherited_env={"engine": {VAR: "fork"}})
    study.set_user_attr(remeasure_key(old, 1), again.to_attrs())
    assert again.to_attrs()["inherited_env"] == {"engine": {VAR: "fork"}}

    assert inherited_changes(study, old, _now({})) == []
    assert remeasured_changes(study, old, _now({})) == [
        f"re-measurement 1: engine: {VAR}: fork then, unset now"
    ]
    assert remeasured_changes(study, old, _now({VAR: "fork"})) == []
    # another trial's re-measurements are not this trial's
    other = _add(study, None, state=TrialState.COMPLETE)
    assert remeasured_changes(study, other, _now({})) == []


def test_a_record_without_the_field_reads_as_before() -> None:
    """Re-measurements stored before the field existed load with it empty (nothing to
    compare), and one without services does not write it."""
    raw = {"of": 3, "repeat": 1, "values": [2.0], "feasible": True, "constraints": {}}
    assert RemeasureRecord.model_validate(raw).inherited_env == {}
    assert "inherited_env" not in RemeasureRecord.model_validate(raw).to_attrs()
