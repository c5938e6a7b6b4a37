"""The study loop: ask -> evaluate -> tell, in the role of Optuna's ``_optimize.py``.

One trial at a time per worker (ask/tell), so each phase can be timed, shown and recovered.
The loop decides *whether* a configuration is launched (never when a forbidden rule applies,
never twice: an identical earlier result is reused, and in a shared study a configuration is
claimed before launch); the trial pipeline (:mod:`autotune.trial.pipeline`, no Optuna) does
the launching, probing, measuring and scoring. A launch that fails is completed as
infeasible with its failure class so the sampler learns to avoid it.

This module keeps the outer loop (the trial target, the re-measure and explanation phases,
the session and the wind-down); one trial, from ``ask`` to ``store``, is
:mod:`autotune.study._trial_step`, and what the constructor derives from the definition
(the load, a warm start, the reference) :mod:`autotune.study._setup`. Around it, each in its
own module: recovery of what an earlier run left (:mod:`autotune.study.recovery`),
Ctrl-C/SIGTERM handling (:mod:`autotune.study.interrupts`), the early-abort policy
(:mod:`autotune.study.abort`), claims (:mod:`autotune.study.claims`) and the re-measure phase
(:mod:`autotune.study.remeasure`).

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
from typing import TypeVar

from optuna.trial import TrialState

from autotune.deployment import Deployment, load_deployment
from autotune.engines import get_engine
from autotune.errors import ConfigError
from autotune.explain import ExplainSettings, Explanation
from autotune.failpoints import failpoint
from autotune.launch import Launcher
from autotune.launch.factory import make_launcher
from autotune.loadgen import LoadSpec
from autotune.render import render
from autotune.results import own_trials
from autotune.space import SearchSpace, load_space
from autotune.study._setup import StudyReference, load_spec, warm_start_plan
from autotune.study._trial_step import TrialStep
from autotune.study.abort import AbortPolicy, make_abort_policy
from autotune.study.claims import BASELINE_CLAIM, claim
from autotune.study.context import StudyContext
from autotune.study.definition import StudyDefinition, WarmStartSettings
from autotune.study.environment import space_engines
from autotune.study.explainer import Explainer, RunSource
from autotune.study.hints import Hints
from autotune.study.interrupts import INTERRUPT_PENDING, sigterm_as_interrupt
from autotune.study.journal import Journal
from autotune.study.objectives import Objective
from autotune.study.progress import NullProgress, ProgressSink
from autotune.study.recovery import Recovery
from autotune.study.remeasure import Remeasurer
from autotune.study.samplers import make_sampler
from autotune.study.storage import (
    batching,
    check_study_name,
    create_or_load_study,
    is_server_url,
    open_storage,
    retrying,
    storage_errors,
)
from autotune.study.store import TrialWriter
from autotune.study.warm_start import apply_warm_start, describe_done
from autotune.study.workers import Worker, WorkerBusy, default_worker_name
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

_T = TypeVar("_T")
COUNT_REFRESH = 10
"""Trials between two reads of the completed count from storage (other workers add some)."""


def _dir_name(worker: str) -> str:
    """A worker name as one directory name (names may hold '/' and ':')."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", worker)


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
        self._warm_plan = warm_start_plan(
            self.warm_start,
            study_name=study_name,
            storage_url=storage_url,
            space=self.space,
            enqueue=self._enqueue,
        )
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
            reference=StudyReference(self.study),
            plan=self.plan,
            engines=space_engines(self.space),
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
        self.worker = Worker(
            self.study,
            name=self.worker_name,
            deployment=self.deployment.name,
            heartbeat_s=definition.workers.heartbeat_s,
            lease_s=definition.workers.lease_s,
            on_error=self.progress.message,
        )
        self.trial_step = TrialStep(
            self.ctx,
            self.pipeline,
            worker=self.worker,
            writer=self.writer,
            abort=self.abort,
            on_phase=self._phase,
        )
        """One trial at a time: ask, reuse or claim, the pipeline, store (the reuse index
        and the incumbent are its own)."""

    # ------------------------------------------------------------------ set-up

    def _load_spec(self) -> LoadSpec:
        """The study's load, completed (:func:`autotune.study._setup.load_spec`)."""
        return load_spec(self.definition, self.deployment, self.engine)

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
            self.trial_step.index_known()
            self.trial_step.check_environment()
            done = self.completed_count()
            while done < n_trials:
                if self.shared:
                    self.ctx.db("looking for lost trials", self.recovery.reap_lost)
                if self.trial_step.one_trial(index=done + 1, total=n_trials):
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

        def work() -> Explanation | None:
            self.trial_step.read_cards()
            return self.explainer.run(settings, sources)

        result, summary = self._session(work, started=time.monotonic())
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

    # ------------------------------------------------------------------ one trial

    def _report(self, number: int, outcome: TrialOutcome, elapsed: float) -> None:
        """A finished trial or measurement, shown with the incumbent (:meth:`TrialStep.report`;
        the re-measure and explanation phases report through it too)."""
        self.trial_step.report(number, outcome, elapsed)
