"""One trial of the study loop, and what the loop remembers from one trial to the next.

Steps 1-3 and 8 of docs/ARCHITECTURE.md's "The trial lifecycle": ask (the owner and all the
parameters in one storage transaction), decide whether the configuration needs a launch at
all (forbidden: completed as infeasible; measured already: its result reused; in a shared
study, in flight in another worker's trial: not run), let the trial pipeline measure it
(with the early-abort rule against the incumbent), then store and report it. Interrupted,
claimed elsewhere or cut by a host failure, the trial is told FAIL here.

Apart from :mod:`autotune.study.runner`, which keeps the outer loop (set-up, the trial target,
the re-measure and explanation phases, Ctrl-C and the wind-down), because this is the one
part that runs per trial: the reuse index (canonical config -> trial) and the incumbent live
here, and a reader following one configuration from ``ask`` to ``store`` reads one module.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.failpoints import failpoint
from autotune.failures import Failure
from autotune.results import feasible, objective_label, own_trials
from autotune.study._optuna_compat import storage_of, trial_id_of
from autotune.study.abort import AbortPolicy
from autotune.study.cards import CardWatch
from autotune.study.claims import ClaimedElsewhere, claim_config
from autotune.study.context import StudyContext, close_phases
from autotune.study.environment import check_environment as compare_environment
from autotune.study.environment import environment_line
from autotune.study.interrupts import deferred_interrupts
from autotune.study.progress import TrialReport
from autotune.study.record import fail_trial, inherited_changes, reused_outcome
from autotune.study.storage import batched_writes
from autotune.study.store import TrialWriter
from autotune.study.workers import TRIAL_WORKER_ATTR, Worker
from autotune.trial import HostFailure, TrialOutcome, TrialPipeline


class TrialStep:
    """Asks, evaluates and stores one trial at a time for :class:`~autotune.study.runner.Tuner`."""

    def __init__(
        self,
        ctx: StudyContext,
        pipeline: TrialPipeline,
        *,
        worker: Worker,
        writer: TrialWriter,
        abort: AbortPolicy,
        on_phase: Callable[[str], None],
    ) -> None:
        self.ctx = ctx
        self.pipeline = pipeline
        self.worker = worker
        self.writer = writer
        self.abort = abort
        self.on_phase = on_phase
        self._known: dict[str, list[int]] = {}
        """Canonical config -> the trials that measured it, oldest first (one per
        environment, in effect: a config is measured again only where the environment
        differed)."""
        self._incumbent: tuple[float, int] | None = None
        """(throughput, trial) of the best feasible, fully measured trial: kept in memory."""
        self._cards = CardWatch()
        """The kinds of GPU the study's runs came from (:meth:`read_cards`)."""

    def read_cards(self) -> None:
        """Read the kinds of GPU of the study's stored runs, before a session's first run
        (a run is reported after it is stored, so it is observed on its own)."""
        self._cards = CardWatch.from_study(self.ctx.study)

    def index_known(self) -> None:
        self.read_cards()
        for trial in own_trials(self.ctx.study, states=(TrialState.COMPLETE,)):
            config = trial.user_attrs.get("config")
            if config is not None and trial.user_attrs.get("failure") != Failure.interrupted:
                self._remember(self.ctx.space.config_key(config), trial.number)
            if (
                feasible(trial)
                and trial.user_attrs.get("failure") is None
                and not trial.user_attrs.get("aborted")
            ):
                self._consider_incumbent(trial.values[0], trial.number)

    def check_environment(self) -> None:
        """Say once, at the start of a session, how the variables the services inherit from
        autotune's environment differ from those of the newest trial that recorded them
        (:mod:`autotune.trial.inherited_env`): measurements taken under other variables
        are not reused, and compare with this session's only where those do not matter."""
        prepared = self.pipeline.prepare(self.ctx.space.baseline_config(), is_baseline=True)
        if isinstance(prepared, TrialOutcome):
            return
        check = compare_environment(self.ctx.study, prepared.record.services)
        if check.changes:
            self.ctx.progress.message(f"the services' environment {environment_line(check)}")

    def _remember(self, key: str, number: int) -> None:
        known = self._known.setdefault(key, [])
        if number not in known:
            known.append(number)

    def _consider_incumbent(self, throughput: float, number: int) -> None:
        if self._incumbent is None or (throughput, -number) > (
            self._incumbent[0],
            -self._incumbent[1],
        ):
            self._incumbent = (throughput, number)

    def one_trial(self, *, index: int, total: int) -> bool:
        """One trial, stored; False when it was not run (its config was claimed by another
        worker's trial in flight: recorded as FAIL, not counted)."""
        t0 = time.monotonic()
        trial: optuna.Trial | None = None
        try:
            with deferred_interrupts():
                trial = self.ctx.study.ask()
            self.worker.on_trial(trial)
            failpoint("trial.asked")
            with deferred_interrupts(), batched_writes(self.ctx.study, trial_id_of(trial)):
                # One transaction for all the parameters (each would be its own commit) and
                # the owner, written before anything is launched, so a retry finds them.
                storage_of(self.ctx.study).set_trial_system_attr(
                    trial_id_of(trial), TRIAL_WORKER_ATTR, self.ctx.worker_name
                )
                config = self.ctx.space.suggest(trial)
            self.ctx.progress.trial_started(
                number=trial.number, index=index, total=total, config=config
            )
            outcome = self.evaluate(
                config,
                is_baseline=bool(trial.user_attrs.get("is_baseline", False)),
                claim_as=trial.number if self.ctx.shared else None,
            )
        except ClaimedElsewhere as exc:
            assert trial is not None
            with deferred_interrupts():
                fail_trial(self.ctx.study, trial, failure=Failure.claimed.value, reason=str(exc))
            self.worker.on_trial(None)
            self.ctx.progress.message(f"trial #{trial.number} not run: {exc}")
            return False
        except HostFailure as exc:
            assert trial is not None  # raised by the pipeline
            self.ctx.retry_later(trial.number)
            fail_trial(
                self.ctx.study, trial, failure=Failure.host_unreachable.value, reason=str(exc)
            )
            raise
        except KeyboardInterrupt:
            if trial is None:  # interrupted before the trial existed
                raise
            with deferred_interrupts():
                self.ctx.retry_later(trial.number)
                fail_trial(
                    self.ctx.study,
                    trial,
                    failure=Failure.interrupted.value,
                    reason="stopped by the user (Ctrl-C/SIGTERM)",
                )
            self.ctx.progress.message(
                f"interrupted during trial #{trial.number}: recorded as FAIL (interrupted), "
                "its config will be retried by the next `autotune run`; services are being stopped"
            )
            raise
        elapsed = close_phases(outcome, t0)
        self.on_phase("store")
        stored = self.writer.store(trial, outcome)
        self.worker.on_trial(None)
        if not stored:
            return False
        self.worker.trial_done()
        key = self.ctx.space.config_key(config)
        if outcome.record.reused_from is None:
            self._remember(key, trial.number)
        if outcome.failure is None and outcome.feasible and not outcome.record.aborted:
            self._consider_incumbent(outcome.values[0], trial.number)
        self.report(trial.number, outcome, elapsed)
        return True

    def evaluate(
        self,
        config: dict[str, Any],
        *,
        is_baseline: bool,
        fresh: bool = False,
        claim_as: int | None = None,
    ) -> TrialOutcome:
        """The pipeline's outcome for ``config``, unless an identical configuration was
        measured already (its result is reused) or, with ``claim_as`` (a shared study), is
        in flight in another worker's trial (:class:`ClaimedElsewhere`)."""
        prepared = self.pipeline.prepare(config, is_baseline=is_baseline)
        if isinstance(prepared, TrialOutcome):
            return prepared  # forbidden: nothing launched
        key = self.ctx.space.config_key(config)
        candidates = [] if fresh else list(self._known.get(key, []))
        if not candidates and claim_as is not None:  # fresh too: the claim says "in flight"
            claimed = claim_config(self.ctx.study, key, claim_as, db=self.ctx.db)
            if claimed is not None:
                self._remember(key, claimed)
                candidates = [claimed]
        previous, changed = None, []
        for number in candidates:
            changed = inherited_changes(self.ctx.study, number, prepared.record)
            if not changed:
                previous = number
                break
        if previous is None and changed:
            self.ctx.progress.message(
                f"trial #{candidates[0]}'s identical configuration is measured again, not "
                f"reused: it ran in another environment ({'; '.join(changed)})"
            )
        if previous is not None:
            return reused_outcome(
                self.ctx.study, previous, prepared.record, objective=self.ctx.objective
            )
        abort_if = (
            None if fresh else self.abort.rule(incumbent=self._incumbent, load=self.pipeline.load)
        )
        return self.pipeline.measure(prepared, fresh=fresh, abort_if=abort_if)

    def report(self, number: int, outcome: TrialOutcome, elapsed: float) -> None:
        best = self._incumbent
        record = outcome.record
        if record.telemetry is not None and record.reused_from is None:
            warning = self._cards.observe(record.telemetry.card, run=f"the run of #{number}")
            if warning is not None:
                self.ctx.progress.message(warning)
        reason = record.reason
        if record.aborted:
            reason = f"aborted: {record.aborted}"
        self.ctx.progress.trial_finished(
            TrialReport(
                number=number,
                throughput=outcome.values[0] if outcome.failure is None else None,
                failure=outcome.failure,
                reason=reason,
                best=best[0] if best else None,
                best_number=best[1] if best else None,
                seconds=elapsed,
                reused_from=record.reused_from,
                aborted=bool(record.aborted),
                unit=objective_label(self.ctx.objective.metric_names)[1],
            )
        )
