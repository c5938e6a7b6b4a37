"""The storage step of a trial: journal first, then the study, never half of either.

A measurement costs minutes; a storage write can fail (a database server away, a disk full,
the tuner killed between two writes). So a measured outcome goes to the local journal
(:mod:`autotune.study.journal`) first, then into the study (COMPLETE, one transaction for
its attributes), then the journal entry is removed; Ctrl-C/SIGTERM wait until all of it is
done. Whatever happens, the study holds the trial COMPLETE or RUNNING with its measurement
in the journal, which the next run records (:mod:`autotune.study.recovery`).
"""

from __future__ import annotations

from pathlib import Path

import optuna

from autotune.errors import StorageError
from autotune.failpoints import failpoint
from autotune.study._optuna_compat import trial_id_of
from autotune.study.context import StudyContext
from autotune.study.interrupts import deferred_interrupts
from autotune.study.journal import Entry
from autotune.study.record import finish_trial, redact_record
from autotune.study.storage import describe_storage_failure, display_url
from autotune.trial import TrialOutcome


class TrialWriter:
    """Stores the outcomes of one worker's trials."""

    def __init__(self, ctx: StudyContext) -> None:
        self.ctx = ctx

    def store(self, trial: optuna.Trial, outcome: TrialOutcome) -> bool:
        """Journal first, then storage, with Ctrl-C/SIGTERM held until both are done.

        A failed write keeps the measurement in the journal for the next run (a database
        server that went away is waited for first, see ``autotune.study.storage.retrying``;
        Ctrl-C ends that wait). False: another worker had already failed the trial as lost
        (this one was silent past the lease) and re-queued its configuration; the
        measurement is dropped so the configuration is not recorded twice.
        """
        outcome.record = redact_record(outcome.record)  # the journal holds no secret either
        trial_id = trial_id_of(trial)
        with deferred_interrupts():
            journaled = self._journal(trial, outcome)
            failpoint("journal.saved")
            try:
                finish_trial(
                    self.ctx.study,
                    trial,
                    outcome,
                    constraint_keys=self.ctx.objective.constraint_keys,
                )
            except optuna.exceptions.UpdateFinishedTrialError:
                if journaled is not None:
                    self.ctx.journal.discard(trial_id)
                self.ctx.progress.message(
                    f"trial #{trial.number} was taken over by another worker while this one "
                    "sent no heartbeat for longer than the lease; its configuration was "
                    "re-queued there, so this measurement is not stored"
                )
                return False
            except Exception as exc:
                kept = (
                    f"its measurement is kept in {journaled} and the next `autotune run` "
                    "records it before anything else"
                    if journaled
                    else "it stays RUNNING; the next `autotune run` fails it as interrupted "
                    "and retries its config"
                )
                url = self.ctx.storage_url
                why = describe_storage_failure(exc, url=url)
                raise StorageError(
                    f"could not record trial #{trial.number} in {display_url(url)}: "
                    f"{why}. Nothing was half-written: {kept}"
                ) from exc
            failpoint("trial.told")
            if journaled is not None:
                self.ctx.journal.discard(trial_id)
        return True

    def _journal(self, trial: optuna.Trial, outcome: TrialOutcome) -> Path | None:
        """Save a measured outcome locally; None when nothing was measured or it failed."""
        if not outcome.record.phase_seconds.get("restart", 0.0):
            return None  # forbidden or reused: free to recompute
        entry = Entry(
            values=outcome.values,
            constraints=outcome.constraints,
            attrs=outcome.record.to_attrs(),
        )
        try:
            return self.ctx.journal.save(trial_id_of(trial), number=trial.number, outcome=entry)
        except OSError as exc:
            self.ctx.progress.message(
                f"could not journal trial #{trial.number} ({exc.strerror or exc}); "
                "writing it to storage directly"
            )
            return None
