"""Settling what an earlier run left behind, before the loop asks for a new trial.

A tuner that was killed, or could not write, leaves trials RUNNING: measured ones (their
outcome is in the journal) are recorded as they were measured; the others are failed as
``interrupted`` and their configuration retried. In a shared study a worker also fails the
trials of workers that stopped beating (``worker_lost``) and re-queues them.
"""

from __future__ import annotations

import datetime as dt

import optuna
from optuna.trial import TrialState

from autotune.failures import Failure
from autotune.results import remeasure_key
from autotune.study._optuna_compat import storage_of, trial_id_of
from autotune.study.context import StudyContext
from autotune.study.interrupts import deferred_interrupts
from autotune.study.record import finish_trial
from autotune.study.workers import (
    TRIAL_WORKER_ATTR,
    LostTrial,
    fail_lost_trial,
    is_gone,
    lost_trials,
    read_workers,
)
from autotune.trial.record import TrialOutcome, TrialRecord


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class Recovery:
    """Recovery of one worker's study at start-up, and of lost workers' trials after."""

    def __init__(self, ctx: StudyContext) -> None:
        self.ctx = ctx

    def recover_stale(self) -> None:
        """Trials left RUNNING by a tuner that died or could not write are settled."""
        ctx = self.ctx
        self.recover_remeasurements()
        running = ctx.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        running_ids = {trial_id_of(t) for t in running}
        for trial_id in ctx.journal.trial_ids():
            if trial_id not in running_ids:  # recorded already; the tuner died before cleaning
                ctx.journal.discard(trial_id)
        now = _utcnow()
        records = read_workers(ctx.study)
        live = {
            name
            for name, record in records.items()
            if name != ctx.worker_name
            and record is not None
            and record.is_live(now)
            and not is_gone(record)
        }
        for trial in running:
            owner = trial.system_attrs.get(TRIAL_WORKER_ATTR)
            if owner in live or (owner is None and live):
                continue  # another worker's, alive (or unknown: its lease decides)
            if owner is not None and owner != ctx.worker_name:
                record = records.get(owner)
                gone = "its record is unreadable" if record is None else record.describe_gone(now)
                self.fail_lost(
                    LostTrial(trial_id_of(trial), trial.number, owner, None),
                    reason=f"worker {owner!r} is gone ({gone}); the config is retried",
                )
                continue
            trial_id = trial_id_of(trial)
            saved = ctx.journal.load(trial_id)
            if saved is not None:
                outcome = TrialOutcome(
                    values=saved.values,
                    constraints=saved.constraints,
                    record=TrialRecord.from_attrs(saved.attrs, where=f"journal of #{trial.number}"),
                )
                with deferred_interrupts():
                    finish_trial(
                        ctx.study,
                        optuna.Trial(ctx.study, trial_id),
                        outcome,
                        constraint_keys=ctx.objective.constraint_keys,
                    )
                ctx.journal.discard(trial_id)
                ctx.progress.message(
                    f"trial #{trial.number} was measured but not stored (the tuner stopped "
                    "or the storage failed while writing it); recorded now from the journal"
                )
                continue
            ctx.retry_later(trial.number)
            storage = storage_of(ctx.study)
            storage.set_trial_user_attr(trial_id, "failure", Failure.interrupted.value)
            storage.set_trial_user_attr(
                trial_id, "reason", "the tuner stopped during this trial; its config is retried"
            )
            storage.set_trial_state_values(trial_id, state=TrialState.FAIL)
            ctx.progress.message(
                f"trial #{trial.number} was interrupted earlier; retrying its config"
            )

    def recover_remeasurements(self) -> None:
        """Re-measurements journaled but not stored (the tuner stopped between the two) are
        stored now; entries already stored are discarded."""
        ctx = self.ctx
        ids = ctx.remeasure_journal.trial_ids()
        if not ids:
            return
        stored = ctx.study.user_attrs
        for entry in ids:
            saved = ctx.remeasure_journal.load(entry)
            if saved is not None:
                key = remeasure_key(int(saved.attrs["of"]), int(saved.attrs["repeat"]))
                if key not in stored:
                    with deferred_interrupts():
                        ctx.study.set_user_attr(key, saved.attrs)
                    ctx.progress.message(
                        f"re-measurement {saved.attrs['repeat']} of trial #{saved.attrs['of']} "
                        "was measured but not stored; recorded now from the journal"
                    )
            ctx.remeasure_journal.discard(entry)

    def reap_lost(self) -> None:
        """Fail and re-queue the trials of workers that stopped beating (other workers')."""
        ctx = self.ctx
        lease = ctx.definition.workers.lease_s
        for lost in lost_trials(ctx.study, lease_s=lease, exclude_worker=ctx.worker_name):
            who = f"worker {lost.worker!r}" if lost.worker else "its worker"
            silent = (
                f"no heartbeat for {lost.silent_s:.0f} s"
                if lost.silent_s is not None
                else "no heartbeat at all"
            )
            self.fail_lost(
                lost, reason=f"{who} stopped ({silent}, lease {lease:g} s); the config is retried"
            )

    def fail_lost(self, lost: LostTrial, *, reason: str) -> None:
        ctx = self.ctx
        with deferred_interrupts():
            if not fail_lost_trial(ctx.study, lost, reason=reason):
                return  # another worker did it first
            ctx.retry_later(lost.number)
        ctx.progress.message(f"trial #{lost.number} failed as worker_lost: {reason}")
