"""ServiceStartup: the spans of a start and how a trial stores them (the launcher's timing of
real processes is tests/launch/test_launch_local.py's)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from autotune.errors import StorageError
from autotune.launch import BEFORE_STAGES, ServiceStartup, StageMark
from autotune.trial.record import SCHEMA_VERSION, TrialRecord


def _startup(**kw: object) -> ServiceStartup:
    marks = [StageMark(stage="loading", at_s=5.0), StageMark(stage="compiling", at_s=12.0)]
    return ServiceStartup.model_validate({"stages": marks, **kw})


def test_the_spans_of_a_healthy_start_add_up_to_it() -> None:
    spans = _startup(ready_s=40.0).spans()
    assert spans == [(BEFORE_STAGES, 5.0), ("loading", 7.0), ("compiling", 28.0)]


def test_a_failed_start_ends_in_the_stage_it_failed_in() -> None:
    assert _startup(failed_s=20.0).spans()[-1] == ("compiling", 8.0)


def test_an_engine_without_stage_lines_is_one_span() -> None:
    assert ServiceStartup(ready_s=3.5).spans() == [(BEFORE_STAGES, 3.5)]


def test_a_start_still_running_has_no_last_span() -> None:
    assert _startup().spans() == [(BEFORE_STAGES, 5.0), ("loading", 7.0)]


def test_a_trial_stores_it_and_older_trials_read_without_it() -> None:
    record = TrialRecord(startup={"server": _startup(ready_s=40.0)})
    attrs = record.to_attrs()
    assert attrs["schema_version"] == SCHEMA_VERSION >= 7
    assert attrs["startup"]["server"]["stages"][1] == {"stage": "compiling", "at_s": 12.0}
    assert TrialRecord.from_attrs(attrs).startup == record.startup
    old = {"schema_version": 6, "config": {"a": 1}, "phase_seconds": {"restart": 9.0}}
    assert TrialRecord.from_attrs(old).startup == {}
    assert "startup" not in TrialRecord.from_attrs(old).to_attrs()


def test_a_malformed_stored_start_is_a_named_storage_error() -> None:
    bad = {"schema_version": 7, "startup": {"server": {"stages": [{"stage": "x", "at_s": -1}]}}}
    with pytest.raises(StorageError, match=r"(?s)trial 4: .*startup\.server\.stages\.0\.at_s"):
        TrialRecord.from_attrs(bad, where="trial 4")
    with pytest.raises(ValidationError):
        StageMark(stage="x", at_s=-0.5)
