"""What the parts of a running study share: the study and its storage, the definition, the
journals, the progress sink and how a direct database call is retried.

The loop (:mod:`autotune.study.runner`), recovery (:mod:`autotune.study.recovery`) and
re-measurement (:mod:`autotune.study.remeasure`) each take one :class:`StudyContext` instead
of a dozen arguments, and none of them holds another.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import optuna

from autotune.failpoints import failpoint
from autotune.space import SearchSpace
from autotune.study._optuna_compat import trial_by_number
from autotune.study.definition import StudyDefinition
from autotune.study.interrupts import INTERRUPT_PENDING
from autotune.study.journal import Journal
from autotune.study.objectives import Objective
from autotune.study.progress import ProgressSink
from autotune.study.storage import retrying
from autotune.trial.record import MEASURED_PHASES, TrialOutcome

_T = TypeVar("_T")


RETRIED_ATTRS = ("is_baseline", "label")
"""The attributes a trial is enqueued with that say what it is (the baseline; a named
configuration such as a check study's "hand-picked" or "winner #21"): its retry carries them,
so that a configuration cut by a crash is still found under its name once measured."""


@dataclass
class StudyContext:
    study: optuna.Study
    storage: optuna.storages.BaseStorage
    storage_url: str
    definition: StudyDefinition
    space: SearchSpace
    objective: Objective
    progress: ProgressSink
    journal: Journal
    remeasure_journal: Journal
    worker_name: str
    shared: bool
    """Several workers may share the study (a database server): configurations are claimed,
    lost trials looked for and counts read back every trial. On SQLite one worker runs at a
    time (a second one is refused) and none of that costs a write."""

    def db(self, what: str, fn: Callable[[], _T]) -> _T:
        """``fn`` (direct SQL: claims, lost trials) retried with backoff while a database
        server is unreachable; storage calls through Optuna are retried by the storage."""
        return retrying(
            fn,
            url=self.storage_url,
            what=what,
            on_wait=self.progress.message,
            stop=INTERRUPT_PENDING.is_set,
        )

    def retry_later(self, number: int) -> None:
        """Enqueue the parameters of trial ``number``, which was not scored (interrupted,
        host down), read from the storage alone (not a copy of every trial; the check for an
        existing retry reads the trials once, on these failure paths only).

        A trial stopped before it suggested anything still carries the parameters it was
        enqueued with (the baseline, a retry): those are what is retried. Called *before*
        the trial is marked FAIL, and a no-op when its retry is already enqueued: a kill
        between the two writes leaves the trial RUNNING with its retry waiting, and the next
        run's recovery settles it without a second retry (marked FAIL first, such a kill
        left a FAIL trial that nothing would ever retry).
        """
        frozen = trial_by_number(self.study, number)
        params = frozen.params or frozen.system_attrs.get("fixed_params") or {}
        if not params:
            return
        trials = self.study.get_trials(deepcopy=False)
        if any(t.user_attrs.get("retry_of") == number for t in trials):
            return
        attrs: dict[str, object] = {"retry_of": number}
        for key in RETRIED_ATTRS:  # what it was enqueued as goes with its config
            if frozen.user_attrs.get(key):
                attrs[key] = frozen.user_attrs[key]
        self.study.enqueue_trial(params, user_attrs=attrs)
        failpoint("retry.enqueued")


def close_phases(outcome: TrialOutcome, t0: float) -> float:
    """Set ``tuner`` (what is not time on the deployment) and ``total``; the elapsed s."""
    elapsed = time.monotonic() - t0
    phases = outcome.record.phase_seconds
    measured = sum(phases.get(k, 0.0) for k in MEASURED_PHASES)
    phases["tuner"] = max(0.0, elapsed - measured)
    phases["total"] = elapsed
    return elapsed
