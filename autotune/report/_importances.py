"""Optuna's parameter importances over a study's feasible trials, computed once per report
(the importance section draws them beside the explanation's measured contributions).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import optuna
from optuna.trial import TrialState

from autotune.results import TrialResult, own_trials

MIN_IMPORTANCE_TRIALS = 5
"""Below this many feasible trials importances are noise: the section is left out."""


def importance_trials(results: Sequence[TrialResult]) -> int:
    """Feasible trials with parameters; 0 below :data:`MIN_IMPORTANCE_TRIALS` (too few for
    importances that mean anything)."""
    n = sum(1 for r in results if r.feasible and r.throughput is not None and r.params)
    return n if n >= MIN_IMPORTANCE_TRIALS else 0


def param_importances(study: optuna.Study) -> dict[str, float]:
    """Optuna's default evaluator (PED-ANOVA) on the first objective of the feasible trials
    ({} if it cannot).

    The feasible trials are copied (with their real distributions) into an in-memory
    single-objective study, so that infeasible trials and a second objective stay out.
    """
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "new study created" line
    try:
        copy = optuna.create_study(direction="maximize")
    finally:
        optuna.logging.set_verbosity(verbosity)
    for trial in own_trials(study, states=(TrialState.COMPLETE,)):
        result = TrialResult.from_frozen(trial, metric_names=study.metric_names)
        if not result.feasible or result.throughput is None or not trial.params:
            continue
        copy.add_trial(
            optuna.trial.create_trial(
                params=trial.params, distributions=trial.distributions, value=result.throughput
            )
        )
    if len(copy.trials) < MIN_IMPORTANCE_TRIALS:
        return {}
    try:
        with warnings.catch_warnings():
            # "Some regimes ... have less than 2 trials": said per parameter on stderr by
            # every `autotune report`; the section says what importances are worth instead.
            warnings.simplefilter("ignore", UserWarning)
            return dict(optuna.importance.get_param_importances(copy))
    except (ValueError, RuntimeError, ZeroDivisionError):
        return {}
