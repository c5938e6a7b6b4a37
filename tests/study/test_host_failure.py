"""A host that cannot be reached stops the run without scoring the configuration."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from e2e_helpers import E2E_STUDY
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
