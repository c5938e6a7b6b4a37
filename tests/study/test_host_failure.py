"""A host that cannot be reached stops the run without scoring the configuration."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml
from e2e_helpers import E2E_STUDY, REPO
from optuna.trial import TrialState

from autotune.errors import LaunchError
from autotune.launch.base import EventCallback, Launcher, RunningState
from autotune.specs import ServiceSpec
from autotune.study.definition import load_study_definition
from autotune.study.runner import Tuner
from autotune.trial import HostFailure


class UnreachableLauncher(Launcher):
    """Unit-test double: every start fails as if SSH to the host had dropped."""

    def _current(self) -> dict[str, RunningState]:
        return {}

    def _stop(self, names: Sequence[str], on_event: EventCallback) -> None:
        pass

    def _start(self, spec: ServiceSpec) -> None:
        raise LaunchError(
            "host gpu-b unreachable: connection reset",
            service=spec.name,
            failure="host_unreachable",
        )

    def _poll_ready(self, spec: ServiceSpec) -> bool:
        return True

    def stop_all(self) -> None:
        pass


def test_unreachable_host_fails_trial_and_retries_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    definition = load_study_definition(E2E_STUDY)
    tuner = Tuner(
        definition=definition,
        study_name="hf",
        storage_url=f"sqlite:///{tmp_path / 'hf.db'}",
        launcher=UnreachableLauncher(),
    )
    with pytest.raises(HostFailure, match="unreachable"):
        tuner.run(n_trials=3)
    trials = tuner.study.get_trials()
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert len(failed) == 1
    assert failed[0].user_attrs["failure"] == "host_unreachable"
    assert "connection reset" in failed[0].user_attrs["reason"]
    waiting = tuner.study.get_trials(states=(TrialState.WAITING,))
    assert len(waiting) == 1 and waiting[0].user_attrs["retry_of"] == failed[0].number
    assert waiting[0].user_attrs["is_baseline"] is True  # the baseline is retried as the baseline
    assert not [t for t in trials if t.state == TrialState.COMPLETE]  # nothing scored


def test_a_program_that_is_not_there_stops_the_run_with_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deployment whose program does not exist (an engine environment not built yet) fails
    the same way for every configuration: the run stops at the first trial, naming the
    program, instead of recording every trial infeasible; the trial is retried on resume."""
    monkeypatch.chdir(tmp_path)
    dep = yaml.safe_load((REPO / "launchers" / "vllm-cpu-local.yaml").read_text())
    (tmp_path / "launchers").mkdir()
    (tmp_path / "launchers" / "vllm.yaml").write_text(yaml.safe_dump(dep))  # no .venv-engines
    study = yaml.safe_load(E2E_STUDY.read_text())
    study.update(
        space=str(REPO / "search_spaces" / "vllm-cpu.yaml"),
        deployment=str(tmp_path / "launchers" / "vllm.yaml"),
        correctness={"enabled": False},
    )
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    tuner = Tuner(
        definition=load_study_definition(tmp_path / "study.yaml"),
        study_name="missing",
        storage_url=f"sqlite:///{tmp_path / 'm.db'}",
    )
    program = f"{tmp_path}/launchers/../.venv-engines/vllm-0.32.0/bin/python"
    with pytest.raises(HostFailure, match="cannot start") as info:
        tuner.run(n_trials=3)
    assert program in str(info.value) and "No such file" in str(info.value)
    trials = tuner.study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.WAITING]
