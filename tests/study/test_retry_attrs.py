"""A retried trial keeps what it was enqueued as: the check study of the H200 (issue 28) lost its
winner's "winner #21" label when the machine went back mid-trial and the retry measured it
unnamed, so the side-by-side reader found no winner among three measured configurations."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
from optuna.trial import TrialState

from autotune.study.context import StudyContext


def _study_with_running(user_attrs: dict[str, object]) -> tuple[optuna.Study, int]:
    """A study whose trial, enqueued with ``user_attrs``, runs (as one cut by a crash)."""
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    study.enqueue_trial({"x": 3}, user_attrs=user_attrs)
    trial = study.ask({"x": optuna.distributions.IntDistribution(0, 9)})
    trial.set_user_attr("failure", "interrupted")  # written while it ran: not carried
    return study, trial.number


def _retry(study: optuna.Study, number: int) -> optuna.trial.FrozenTrial:
    StudyContext.retry_later(SimpleNamespace(study=study), number)  # type: ignore[arg-type]
    (waiting,) = study.get_trials(states=(TrialState.WAITING,))
    return waiting


def test_a_named_configuration_is_retried_under_its_name() -> None:
    study, number = _study_with_running({"label": "winner #21"})
    waiting = _retry(study, number)
    assert waiting.system_attrs["fixed_params"] == {"x": 3}
    assert waiting.user_attrs == {"retry_of": number, "label": "winner #21"}


def test_the_baseline_is_retried_as_the_baseline_and_nothing_else_is_carried() -> None:
    study, number = _study_with_running({"is_baseline": True})
    waiting = _retry(study, number)
    assert waiting.user_attrs == {"retry_of": number, "is_baseline": True}


def test_a_retry_is_enqueued_once() -> None:
    study, number = _study_with_running({"label": "hand-picked"})
    _retry(study, number)
    StudyContext.retry_later(SimpleNamespace(study=study), number)  # type: ignore[arg-type]
    assert len(study.get_trials(states=(TrialState.WAITING,))) == 1
