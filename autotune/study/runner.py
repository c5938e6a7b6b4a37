"""The study loop: ask -> evaluate -> tell, in the role of Optuna's ``_optimize.py``.

One trial at a time per worker (ask/tell), so each phase can be timed, shown and recovered.
The loop decides *whether* a configuration is launched (never when a forbidden rule applies,
never twice: an identical earlier result is reused, and in a shared study a configuration is
claimed before launch); the trial pipeline (:mod:`autotune.trial.pipeline`, no Optuna) does
the launching, probing, measuring and scoring. A launch that fails is completed as
infeasible with its failure class so the sampler learns to avoid it.

Around it, each in its own module: recovery of what an earlier run left
(:mod:`autotune.study.recovery`), Ctrl-C/SIGTERM handling (:mod:`autotune.study.interrupts`),
the early-abort policy (:mod:`autotune.study.abort`), claims (:mod:`autotune.study.claims`)
and the re-measure phase (:mod:`autotune.study.remeasure`).

Faults (RELIABILITY.md): a measured outcome is written to a local journal before storage,
and storage writes are never cut by Ctrl-C/SIGTERM (deferred to just after the write):
killed or failed at any point, the study holds either a COMPLETE trial or a RUNNING one that
the next run completes from the journal (measured) or fails as ``interrupted`` and retries.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import optuna
from optuna.trial import TrialState

from autotune.deployment import Deployment, load_deployment
from autotune.engines import get_engine
from autotune.errors import ConfigError
from autotune.explain import ExplainSettings, Explanation
from autotune.failpoints import failpoint
from autotune.failures import Failure
from autotune.launch import Launcher
from autotune.launch.factory import make_launcher
from autotune.loadgen import SLO, LoadSpec
from autotune.render import render
from autotune.results import feasible, objective_label, own_trials
from autotune.space import SearchSpace, load_space
from autotune.study._optuna_compat import storage_of, trial_id_of
from autotune.study.abort import AbortPolicy, make_abort_policy
from autotune.study.claims import BASELINE_CLAIM, ClaimedElsewhere, claim, claim_config
from autotune.study.context import StudyContext, close_phases
from autotune.study.definition import StudyDefinition, WarmStartSettings
from autotune.study.explainer import Explainer, RunSource
from autotune.study.hints import Hints
from autotune.study.interrupts import INTERRUPT_PENDING, deferred_interrupts, sigterm_as_interrupt
from autotune.study.journal import Journal
from autotune.study.objectives import Objective
from autotune.study.progress import NullProgress, ProgressSink, TrialReport
from autotune.study.record import fail_trial, reused_outcome
from autotune.study.recovery import Recovery
from autotune.study.remeasure import Remeasurer
from autotune.study.samplers import make_sampler
from autotune.study.storage import (
    batched_writes,
    batching,
    check_study_name,
    create_or_load_study,
    display_url,
    has_trials,
    is_server_url,
    open_storage,
    retrying,
    storage_errors,
)
from autotune.study.store import TrialWriter
from autotune.study.warm_start import (
    WarmStartPlan,
    apply_warm_start,
    describe_done,
    open_source,
    plan_warm_start,
)
from autotune.study.workers import TRIAL_WORKER_ATTR, Worker, WorkerBusy, default_worker_name
from autotune.trial import (
    FAULT_SCAN_LINES,
    HostFailure,
    MeasurePlan,
    PipelineSettings,
    ProbeSettings,
    TrialOutcome,
    TrialPipeline,
)

__all__ = ["FAULT_SCAN_LINES", "HostFailure", "RunSummary", "Tuner"]

REFERENCE_ATTR = "reference_output"
_T = TypeVar("_T")
COUNT_REFRESH = 10
"""Trials between two reads of the completed count from storage (other workers add some)."""


def _dir_name(worker: str) -> str:
    """A worker name as one directory name (names may hold '/' and ':')."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", worker)


def _on_wall_clock(limit_ms: float | None, speedup: float) -> float | None:
    return None if limit_ms is None else limit_ms / speedup


@dataclass
class RunSummary:
    """What ``autotune run`` did in this invocation."""

    study_name: str
    storage_url: str
    trials_run: int
    trials_total: int
    interrupted: bool
    seconds: float
    stopped: list[str] = field(default_factory=list)
    """Services this run stopped on its way out."""
    left_running: list[str] = field(default_factory=list)
    """Services still running after it (a second Ctrl-C cut the clean-up short)."""
    remeasured: int = 0
    """Re-measurements stored by this run."""
    in_remeasure: bool = False
    """The interruption came while re-measuring or explaining (nothing was cut short into a
    FAIL trial)."""
    explained: int = 0
    """Explanation runs stored by this run."""


class _StudyReference:
    """The correctness reference, kept as a study attribute (the first healthy trial's)."""

    def __init__(self, study: optuna.Study) -> None:
        self.study = study

    def get(self) -> str | None:
        value = self.study.user_attrs.get(REFERENCE_ATTR)
        return None if value is None else str(value)

    def set(self, text: str) -> None:
        self.study.set_user_attr(REFERENCE_ATTR, text)


class Tuner:
    """Runs a study defined by a :class:`StudyDefinition` against one deployment."""

    def __init__(
        self,
        *,
        definition: StudyDefinition,
        study_name: str,
        storage_url: str,
        sampler: str | None = None,
        seed: int | None = None,
        launcher: Launcher | None = None,
        progress: ProgressSink | None = None,
        run_dir: Path | None = None,
        worker: str | None = None,
        deployment: Path | None = None,
        warm_start: WarmStartSettings | None = None,
    ) -> None:
        self.definition = definition
        self.study_name = check_study_name(study_name)
        self.storage_url = storage_url
        self.space: SearchSpace = load_space(definition.resolve(definition.space))
        self._enqueue = [
            self.space.variant_params(
                changes, where=f"enqueue[{i}]", file=str(definition.source or "study")
            )
            for i, changes in enumerate(definition.enqueue)
        ]
        """The study's ``enqueue:`` as sampled values, checked before anything runs."""
        self.engine = get_engine(self.space.model.engine.name, self.space.model.engine.version)
        self.deployment: Deployment = load_deployment(
            deployment if deployment is not None else definition.resolve(definition.deployment)
        )
        capacity, curve = definition.measure_plan()
        self.objective = Objective(
            kind=definition.objective,
            slo=definition.slo,
            capacity_over=capacity.over if capacity is not None else "rate",
        )
        self.plan = MeasurePlan(capacity=capacity, curve=curve)
        self.progress = progress or NullProgress()
        sampler_name = sampler or definition.sampler
        self.sampler = make_sampler(
            sampler_name,
            seed=seed if seed is not None else definition.seed,
            grid=self.space.grid() if sampler_name == "grid" else None,
            multi_objective=len(self.objective.directions) > 1,
            hints=Hints.from_space(self.space),
        )
        self.warm_start = warm_start if warm_start is not None else definition.warm_start
        """Where a new study starts from (``--warm-start-from``, the file's ``warm_start:``)."""
        self._warm_plan = self._plan_warm_start(study_name, storage_url)
        self.storage = open_storage(storage_url, create=True)
        self.study = create_or_load_study(
            study_name,
            batching(
                self.storage,
                retry=lambda what, fn: retrying(
                    fn,
                    url=storage_url,
                    what=what,
                    on_wait=self.progress.message,
                    stop=INTERRUPT_PENDING.is_set,
                ),
            ),
            directions=self.objective.directions,
            sampler=self.sampler,
            metric_names=self.objective.metric_names,
        )
        self.worker_name = worker or default_worker_name(self.deployment.name)
        # Named workers keep their own journal and service state (several may share a host).
        default_dir = self.deployment.default_run_dir(study_name)
        self.run_dir = run_dir or (
            default_dir / "workers" / _dir_name(worker) if worker else default_dir
        )
        self.launcher = launcher or make_launcher(self.deployment, run_dir=self.run_dir)
        self.ctx = StudyContext(
            study=self.study,
            storage=self.storage,
            storage_url=storage_url,
            definition=definition,
            space=self.space,
            objective=self.objective,
            progress=self.progress,
            journal=Journal(
                self.run_dir / "journal", storage_url=storage_url, study_name=study_name
            ),
            remeasure_journal=Journal(
                self.run_dir / "journal",
                storage_url=storage_url,
                study_name=f"{study_name}#remeasure",
            ),
            worker_name=self.worker_name,
            shared=is_server_url(storage_url),
        )
        self.journal = self.ctx.journal
        self.shared = self.ctx.shared
        correctness = definition.correctness
        self.pipeline = TrialPipeline(
            space=self.space,
            deployment=self.deployment,
            launcher=self.launcher,
            scorer=self.objective,
            load=self._load_spec(),
            settings=PipelineSettings(
                trial_timeout_s=definition.trial_timeout_s,
                max_error_rate=definition.slo.max_error_rate,
                probe=ProbeSettings(
                    enabled=correctness.enabled,
                    prompt=correctness.prompt,
                    max_tokens=correctness.max_tokens,
                    expected=correctness.expected,
                ),
            ),
            reference=_StudyReference(self.study),
            plan=self.plan,
            engines={
                service: get_engine(
                    self.space.engine_ref(service).name, self.space.engine_ref(service).version
                )
                for service in self.space.services
            },
            run_dir=self.run_dir,
            on_phase=self._phase,
            on_warning=self.progress.message,
        )
        self.abort: AbortPolicy = make_abort_policy(
            definition.early_abort, speedup=self.deployment.sim_speedup
        )
        self.recovery = Recovery(self.ctx)
        self.writer = TrialWriter(self.ctx)
        self.remeasurer = Remeasurer(self.ctx, self.pipeline, report=self._report)
        self.explainer = Explainer(self.ctx, self.pipeline, report=self._report)
        self._known: dict[str, int] = {}
        self._incumbent: tuple[float, int] | None = None
        """(throughput, trial) of the best feasible, fully measured trial: kept in memory."""
        self.worker = Worker(
            self.study,
            name=self.worker_name,
            deployment=self.deployment.name,
            heartbeat_s=definition.workers.heartbeat_s,
            lease_s=definition.workers.lease_s,
            on_error=self.progress.message,
        )

    # ------------------------------------------------------------------ set-up

    def _load_spec(self) -> LoadSpec:
        """The study's load, completed: what the study file leaves unsaid, the engine's
        request quirks decide; the served model is the deployment's, and the SLOs are on the
        wall clock of the servers (a simulated deployment runs ``sim_speedup`` x faster)."""
        load = self.definition.load
        slo = self.definition.slo
        speedup = self.deployment.sim_speedup
        quirks = self.engine.quirks
        given = {k: getattr(load, k) for k in load.given}
        if load.request_rate is not None:  # a rate of the modeled hardware
            given["request_rate"] = load.request_rate * speedup
        # Files the load names are relative to the study file, like its space and deployment.
        if load.tokenizer is not None:
            given["tokenizer"] = str(self.definition.resolve(Path(load.tokenizer)))
        dataset = load.dataset
        if dataset is not None and dataset.kind == "sharegpt":
            given["dataset"] = dataset.model_copy(
                update={"path": self.definition.resolve(dataset.path)}
            )
        return LoadSpec.model_validate(
            {
                "prompt": quirks.prompt,
                "ignore_eos": quirks.ignore_eos,
                "require_done": quirks.require_done,
                **given,
                "model": self.deployment.model,
                "slo": SLO(
                    ttft_ms=_on_wall_clock(slo.ttft_p99_ms, speedup),
                    tpot_ms=_on_wall_clock(slo.tpot_p99_ms, speedup),
                    e2e_ms=_on_wall_clock(slo.e2e_p99_ms, speedup),
                ),
            }
        )

    def _plan_warm_start(self, study_name: str, storage_url: str) -> WarmStartPlan | None:
        """The warm start of a new study, read and translated before anything is created (a
        missing earlier study is an error here); None without one, or when the study has
        trials already (a warm start only seeds a new study)."""
        settings = self.warm_start
        if settings is None:
            return None
        source_url = settings.storage or storage_url
        if settings.study == study_name and source_url == storage_url:
            raise ConfigError(
                f"study {study_name!r} cannot warm-start from itself", field="--warm-start-from"
            )
        if has_trials(storage_url, study_name):
            return None
        with storage_errors(source_url, f"reading study {settings.study!r}"):
            source = open_source(settings.study, source_url)
            return plan_warm_start(
                source,
                space=self.space,
                top=settings.top,
                storage=display_url(source_url),
                enqueued=[
                    *([self.space.baseline_params()] if self.space.has_baseline else []),
                    *self._enqueue,
                ],
            )

    def _phase(self, name: str) -> None:
        self.progress.phase(name)
        self.worker.on_phase(name)

    def _enqueue_baseline(self) -> None:
        """The baseline is trial 0 of a new study, the study's ``enqueue:`` the next ones:
        enqueued by the first worker only."""
        if self.study.get_trials(deepcopy=False):
            if self.warm_start is not None:
                done = describe_done(self.study.user_attrs)
                self.progress.message(
                    f"study {self.study_name!r} {done}: not repeated"
                    if done
                    else f"warm start from {self.warm_start.study!r} not applied: study "
                    f"{self.study_name!r} already has trials (a warm start seeds a new study)"
                )
            return
        if claim(self.study, BASELINE_CLAIM, -1).won:
            self.study.enqueue_trial(self.space.baseline_params(), user_attrs={"is_baseline": True})
            for params in self._enqueue:
                self.study.enqueue_trial(params)
            if self._warm_plan is not None:
                apply_warm_start(
                    self.study,
                    self._warm_plan,
                    space=self.space,
                    objective=self.objective,
                    say=self.progress.message,
                )

    def _index_known(self) -> None:
        for trial in own_trials(self.study, states=(TrialState.COMPLETE,)):
            config = trial.user_attrs.get("config")
            if config is not None and trial.user_attrs.get("failure") != Failure.interrupted:
                self._known.setdefault(self.space.config_key(config), trial.number)
            if (
                feasible(trial)
                and trial.user_attrs.get("failure") is None
                and not trial.user_attrs.get("aborted")
            ):
                self._consider_incumbent(trial.values[0], trial.number)

    def _consider_incumbent(self, throughput: float, number: int) -> None:
        if self._incumbent is None or (throughput, -number) > (
            self._incumbent[0],
            -self._incumbent[1],
        ):
            self._incumbent = (throughput, number)

    def completed_count(self) -> int:
        """This study's completed trials (carried warm-start trials are not its own)."""
        return len(own_trials(self.study, states=(TrialState.COMPLETE,)))

    # ------------------------------------------------------------------ loop

    def run(self, *, n_trials: int) -> RunSummary:
        """Run until the study holds ``n_trials`` completed trials (resumes where it stopped)."""
        started = time.monotonic()
        ran = 0
        self.remeasurer.stored = 0
        self.remeasurer.active = False
        self.explainer.measured = 0

        def trials() -> None:
            nonlocal ran
            self._preflight()
            self._enqueue_baseline()
            self._index_known()
            done = self.completed_count()
            while done < n_trials:
                if self.shared:
                    self.ctx.db("looking for lost trials", self.recovery.reap_lost)
                if self._one_trial(index=done + 1, total=n_trials):
                    ran += 1
                    done += 1
                # Counted in memory (a read of every new trial costs ~6 ms) when this is
                # the only worker; shared storage is asked every trial.
                if self.shared or ran % COUNT_REFRESH == 0 or done >= n_trials:
                    done = self.completed_count()
            self.remeasurer.run(target=n_trials)
            if self.definition.explain.enabled:
                self.explainer.run(self.definition.explain)

        _, summary = self._session(trials, started=started)
        summary.trials_run = ran
        summary.in_remeasure = summary.interrupted and (
            self.remeasurer.active or self.explainer.active
        )
        return summary

    def _preflight(self) -> None:
        """Render the baseline once before any trial is asked: a deployment error every trial
        would hit (a template, ``client_cpus``) stops the run with no trial left RUNNING."""
        p = self.pipeline
        render(p.space, p.deployment, p.space.baseline_config(), run_dir=p.run_dir)

    def explain(
        self, settings: ExplainSettings, sources: Sequence[RunSource] = ()
    ) -> tuple[Explanation | None, RunSummary]:
        """Explain the study's winner (``autotune explain``): resumes a stopped explanation;
        ``sources``: studies whose fresh-start measurements it borrows first."""
        self.explainer.measured = 0
        result, summary = self._session(
            lambda: self.explainer.run(settings, sources), started=time.monotonic()
        )
        summary.in_remeasure = summary.interrupted
        return result, summary

    def _session(self, work: Callable[[], _T], *, started: float) -> tuple[_T | None, RunSummary]:
        """``work`` as this worker (registered, stale trials settled first), with Ctrl-C and
        SIGTERM as a clean stop and the services wound down after; (its result, a summary
        whose trial counts the caller fills in)."""
        interrupted = False
        failed = True
        result: _T | None = None
        try:
            with sigterm_as_interrupt(), storage_errors(self.storage_url, "accessing the study"):
                try:
                    self.worker.start(alone=not self.shared)
                except WorkerBusy as exc:
                    raise ConfigError(str(exc), field="--worker") from None
                self.recovery.recover_stale()
                result = work()
            failed = False
        except KeyboardInterrupt:
            interrupted = True
            failed = False
        finally:
            self.worker.stop("interrupted" if interrupted else "failed" if failed else "stopped")
            stopped, left = self._wind_down(stop=failed or interrupted)
        with storage_errors(self.storage_url, "accessing the study"):
            total = self.completed_count()
        return result, RunSummary(
            study_name=self.study_name,
            storage_url=self.storage_url,
            trials_run=0,
            trials_total=total,
            interrupted=interrupted,
            seconds=time.monotonic() - started,
            stopped=stopped,
            left_running=left,
            remeasured=self.remeasurer.stored,
            explained=self.explainer.measured,
        )

    def _wind_down(self, *, stop: bool) -> tuple[list[str], list[str]]:
        """Stop the services (unless kept on purpose); (stopped, still running).

        A second Ctrl-C during the stop leaves the rest running, recorded where ``autotune
        restore`` and the next ``autotune run`` find and stop them.
        """
        running = self.launcher.running()
        if self.definition.keep_services_running and not stop:
            self.launcher.detach()
            return [], running
        try:
            failpoint("winddown")
            self.launcher.stop_all()
            self.launcher.close()
        except KeyboardInterrupt:
            left = self.launcher.running()
            self.launcher.detach()
            return [n for n in running if n not in left], left
        return running, []

    def _one_trial(self, *, index: int, total: int) -> bool:
        """One trial, stored; False when it was not run (its config was claimed by another
        worker's trial in flight: recorded as FAIL, not counted)."""
        t0 = time.monotonic()
        trial: optuna.Trial | None = None
        try:
            with deferred_interrupts():
                trial = self.study.ask()
            self.worker.on_trial(trial)
            failpoint("trial.asked")
            with deferred_interrupts(), batched_writes(self.study, trial_id_of(trial)):
                # One transaction for all the parameters (each would be its own commit) and
                # the owner, written before anything is launched, so a retry finds them.
                storage_of(self.study).set_trial_system_attr(
                    trial_id_of(trial), TRIAL_WORKER_ATTR, self.worker_name
                )
                config = self.space.suggest(trial)
            self.progress.trial_started(
                number=trial.number, index=index, total=total, config=config
            )
            outcome = self._evaluate(
                config,
                is_baseline=bool(trial.user_attrs.get("is_baseline", False)),
                claim_as=trial.number if self.shared else None,
            )
        except ClaimedElsewhere as exc:
            assert trial is not None
            with deferred_interrupts():
                fail_trial(self.study, trial, failure=Failure.claimed.value, reason=str(exc))
            self.worker.on_trial(None)
            self.progress.message(f"trial #{trial.number} not run: {exc}")
            return False
        except HostFailure as exc:
            assert trial is not None  # raised by the pipeline
            self.ctx.retry_later(trial.number)
            fail_trial(self.study, trial, failure=Failure.host_unreachable.value, reason=str(exc))
            raise
        except KeyboardInterrupt:
            if trial is None:  # interrupted before the trial existed
                raise
            with deferred_interrupts():
                self.ctx.retry_later(trial.number)
                fail_trial(
                    self.study,
                    trial,
                    failure=Failure.interrupted.value,
                    reason="stopped by the user (Ctrl-C/SIGTERM)",
                )
            self.progress.message(
                f"interrupted during trial #{trial.number}: recorded as FAIL (interrupted), "
                "its config will be retried by the next `autotune run`; services are being stopped"
            )
            raise
        elapsed = close_phases(outcome, t0)
        self._phase("store")
        stored = self.writer.store(trial, outcome)
        self.worker.on_trial(None)
        if not stored:
            return False
        self.worker.trial_done()
        key = self.space.config_key(config)
        if outcome.record.reused_from is None:
            self._known.setdefault(key, trial.number)
        if outcome.failure is None and outcome.feasible and not outcome.record.aborted:
            self._consider_incumbent(outcome.values[0], trial.number)
        self._report(trial.number, outcome, elapsed)
        return True

    def _evaluate(
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
        key = self.space.config_key(config)
        previous = None if fresh else self._known.get(key)
        if previous is None and claim_as is not None:
            previous = claim_config(self.study, key, claim_as, db=self.ctx.db)
            if previous is not None:
                self._known.setdefault(key, previous)
        if previous is not None:
            return reused_outcome(self.study, previous, prepared.record, objective=self.objective)
        abort_if = (
            None if fresh else self.abort.rule(incumbent=self._incumbent, load=self.pipeline.load)
        )
        return self.pipeline.measure(prepared, fresh=fresh, abort_if=abort_if)

    def _report(self, number: int, outcome: TrialOutcome, elapsed: float) -> None:
        best = self._incumbent
        record = outcome.record
        reason = record.reason
        if record.aborted:
            reason = f"aborted: {record.aborted}"
        self.progress.trial_finished(
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
                unit=objective_label(self.objective.metric_names)[1],
            )
        )
