"""``autotune explain``: measure what each of the winner's changes bought, from fresh services.

The loop asks the planner (:mod:`autotune.explain.planner`, pure) what to measure next,
measures it through the trial pipeline from freshly started services (as re-measurement
does), stores the run as a study attribute and asks again; a decision the planner takes is
stored before anything else is measured. Interrupted anywhere, the study holds whole runs
and whole decisions only, and the next ``autotune explain`` continues where this one
stopped (a run cut short is measured again). The explanation computed from what is stored
is written as ``explain:result`` at the end, and after every decision and every run, so
``report`` and ``best --minimal`` can use a partial one (``--budget 0`` writes it from the
stored runs alone, measuring nothing: for a study whose explanation was cut before this
was so).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from autotune.errors import AutotuneError, ConfigError
from autotune.explain import (
    ChangeSet,
    Decide,
    ExplainRun,
    ExplainSettings,
    ExplainState,
    Explanation,
    Finished,
    Measure,
    Planner,
    load_runs,
    load_state,
)
from autotune.explain.borrowed import (
    Borrowed,
    borrowable_runs,
    own_terms,
    without_own_winner,
)
from autotune.explain.occasions import lent_by
from autotune.explain.record import RESULT_ATTR, STATE_ATTR, run_key
from autotune.results import best_estimate, objective_label
from autotune.study._optuna_compat import trial_by_number
from autotune.study.context import StudyContext, close_phases
from autotune.study.definition import StudyDefinition
from autotune.study.interrupts import deferred_interrupts
from autotune.study.record import redact_record
from autotune.trial import TrialOutcome, TrialPipeline
from autotune.trial.record import TrialRecord

Report = Callable[[int, TrialOutcome, float], None]

SAME_CONDITIONS: tuple[str, ...] = ("objective", "load", "slo", "capacity", "curve")
"""Study fields that decide what a measurement measures, beside the space and deployment
files (compared as validated models)."""


@dataclass(frozen=True)
class RunSource:
    """A study whose fresh-start measurements an explanation borrows (``--runs-from``)."""

    study: optuna.Study
    definition: StudyDefinition


def check_same_conditions(this: StudyDefinition, other: StudyDefinition) -> None:
    """ConfigError naming ``other``'s file and the first field whose measurement conditions
    differ from ``this`` study's (:mod:`autotune.explain.borrowed`)."""
    where = str(other.source) if other.source else other.name
    for name in ("space", "deployment"):
        mine, theirs = this.resolve(getattr(this, name)), other.resolve(getattr(other, name))
        if _content(mine, where, name) != _content(theirs, where, name):
            raise ConfigError(
                f"study {other.name!r} was measured with {theirs}, study {this.name!r} with "
                f"{mine}, and the files differ: its runs are not runs of these configurations",
                file=where,
                field=name,
            )
    for name in SAME_CONDITIONS:
        if getattr(this, name) != getattr(other, name):
            raise ConfigError(
                f"study {other.name!r} was measured under another {name} than study "
                f"{this.name!r}: its runs are not comparable",
                file=where,
                field=name,
            )


def _content(path: Path, where: str, name: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"cannot read {path}: {exc.strerror or exc}", file=where, field=name
        ) from None


class Explainer:
    """The explain phase of one worker."""

    def __init__(self, ctx: StudyContext, pipeline: TrialPipeline, *, report: Report) -> None:
        self.ctx = ctx
        self.pipeline = pipeline
        self.report = report
        self.active = False
        self.measured = 0
        """Runs this invocation took."""
        self._unread: dict[str, int] = {}
        """Stored runs of a configuration the explanation does not read, by key."""

    def planner(self, settings: ExplainSettings) -> Planner:
        """The plan for the study's current winner (``best``'s pick)."""
        ctx = self.ctx
        estimate = best_estimate(ctx.study)
        if estimate is None:
            raise AutotuneError(
                f"study {ctx.study.study_name!r} has no feasible completed trial to explain"
            )
        if not ctx.space.has_baseline:
            raise ConfigError(
                "explaining a winner needs the space's baseline (what each change is reverted to)",
                file=ctx.space.file,
                field="baseline",
            )
        changes = ChangeSet(
            ctx.space, baseline=ctx.space.baseline_params(), winner=estimate.trial.config
        )
        return Planner(
            changes,
            settings,
            winner=estimate.trial.number,
            prior_noise=(estimate.noise_sd, estimate.noise_df),
        )

    def borrow(
        self,
        sources: Sequence[RunSource],
        winner_trial: int,
        runs: dict[str, list[ExplainRun]],
        changes: ChangeSet,
        *,
        own_repeats: int | None = None,
    ) -> list[Borrowed]:
        """Store the measurements ``sources`` offer (:mod:`autotune.explain.borrowed`) as
        runs of their configurations, each after the runs of its configuration already
        stored, and added to ``runs`` (the stored runs, read once by :meth:`run`); one
        borrowed before (same origin) is not stored twice. ``own_repeats``: also the
        explained study's own trials (``--own-runs``), at most this many runs less one of a
        configuration ``changes`` (the winner's) makes, never the winner's."""
        ctx = self.ctx
        have: set[str | None] = {r.source for rs in runs.values() for r in rs if r.source}
        winner = trial_by_number(ctx.study, winner_trial)
        versions = dict(winner.user_attrs.get("engine_version") or {})
        record = TrialRecord.from_attrs(winner.user_attrs, where=f"trial {winner_trial}")
        inherited = {name: svc.inherited_env for name, svc in record.services.items()}
        out = []
        for src in sources:
            if src.study.study_name == ctx.study.study_name:
                raise ConfigError(
                    f"study {ctx.study.study_name!r} cannot borrow its own trials as another "
                    "study's: they chose the winner, so the winner's figure among them is the "
                    "highest of many noisy ones; --own-runs borrows its other configurations' "
                    "runs (not the winner's), --runs-from a study that measured the winner "
                    "afterwards (a check study)",
                    field="--runs-from",
                )
            check_same_conditions(ctx.definition, src.definition)
        for src in sources:
            offered = borrowable_runs(
                src.study, space=ctx.space, engine_version=versions, inherited=inherited
            )
            out.append(self._take(offered, runs, have))
        if own_repeats is not None:
            own = ctx.study.study_name
            held = Counter(key for key, rs in runs.items() for r in rs if not lent_by(r, own))
            leave, per_config = own_terms(changes, own_repeats)
            offered = borrowable_runs(
                ctx.study,
                space=ctx.space,
                engine_version=versions,
                inherited=inherited,
                leave=leave,
                per_config=per_config,
                held=held,
            )
            out.append(self._take(offered, runs, have))
        return out

    def _index(self, key: str, runs: dict[str, list[ExplainRun]]) -> int:
        """The index of the next run of ``key``: after every stored one, the runs left
        unread (:func:`without_own_winner`) too, so none is overwritten."""
        return len(runs.get(key, ())) + self._unread.get(key, 0)

    def _take(
        self, offered: Borrowed, runs: dict[str, list[ExplainRun]], have: set[str | None]
    ) -> Borrowed:
        """Store what ``offered`` holds that ``have`` (the origins stored) lacks."""
        new = [r for r in offered.runs if r.source not in have]
        for run in new:
            stored = runs.setdefault(run.key, [])
            run = run.model_copy(update={"index": self._index(run.key, runs)})
            self._store(run_key(run.key, run.index), run.model_dump(mode="json"))
            stored.append(run)
            have.add(run.source)
        offered.runs = new
        self.ctx.progress.message(f"borrowed {offered.summary()}")
        return offered

    def run(self, settings: ExplainSettings, sources: Sequence[RunSource] = ()) -> Explanation:
        ctx = self.ctx
        planner = self.planner(settings)
        stored = load_runs(ctx.study)  # read once: from here on, only borrow and this loop add
        winner_key = ctx.space.config_key(planner.changes.winner_config)
        runs = without_own_winner(stored, ctx.study.study_name, winner_key)
        self._unread = {k: len(rs) - len(runs.get(k, ())) for k, rs in stored.items()}
        if sources or settings.own_runs:
            own = settings.repeats if settings.own_runs else None
            self.borrow(sources, planner.winner_number, runs, planner.changes, own_repeats=own)
        state = load_state(ctx.study)
        if state is None or (state.winner, state.winner_key) != (
            planner.winner_number,
            planner.winner.key,
        ):
            state = planner.new_state()
            self._store(STATE_ATTR, state.model_dump(mode="json"))
        what, unit = objective_label(ctx.objective.metric_names)
        names = ", ".join(planner.changes.names) or "none"
        ctx.progress.message(
            f"explaining trial #{planner.winner_number}: {len(planner.changes.changes)} "
            f"change(s) from the baseline ({names}); each configuration {settings.repeats}x "
            "from freshly started services"
        )
        stopped: str | None = None
        self.active = True
        try:
            while True:
                step = planner.next(runs, state)
                if isinstance(step, Finished):
                    if not step.complete:
                        stopped = step.why
                        ctx.progress.message(f"explanation stopped: {stopped}")
                    break
                if isinstance(step, Decide):
                    state = step.state
                    self._store(STATE_ATTR, state.model_dump(mode="json"))
                    ctx.progress.message(step.message)
                    self._store_result(planner, state, runs, what, unit, stopped=None, partial=True)
                    continue
                assert isinstance(step, Measure)
                if settings.budget is not None and self.measured >= settings.budget:
                    stopped = (
                        f"the budget of {settings.budget} restarts is spent"
                        if settings.budget
                        else "written from the runs stored (--budget 0), nothing measured"
                    )
                    ctx.progress.message(f"explanation stopped: {stopped}")
                    break
                index = self._index(step.key, runs)
                runs.setdefault(step.key, []).append(self._measure(step, index=index, state=state))
                state = state.model_copy(update={"runs": state.runs + 1})
                self._store(STATE_ATTR, state.model_dump(mode="json"))
                # A process killed between decisions (a lent machine taken back) leaves
                # the explanation of every run measured so far, not one decision old.
                self._store_result(planner, state, runs, what, unit, stopped=None, partial=True)
        finally:
            self.active = False
        result = self._store_result(
            planner, state, runs, what, unit, stopped=stopped, partial=False
        )
        return result

    def _measure(self, step: Measure, *, index: int, state: ExplainState) -> ExplainRun:
        ctx = self.ctx
        t0 = time.monotonic()
        ctx.progress.trial_started(
            number=state.winner,
            index=state.runs + 1,
            total=0,
            config=step.config,
            kind=f"explain ({step.phase}: {step.why})",
        )
        outcome = self.pipeline.evaluate(dict(step.config), is_baseline=False, fresh=True)
        elapsed = close_phases(outcome, t0)
        record = redact_record(outcome.record)
        run = ExplainRun(
            key=step.key,
            index=index,
            config=record.config,
            values=outcome.values,
            feasible=outcome.feasible and outcome.failure is None,
            failure=record.failure,
            reason=record.reason,
            metrics=record.metrics,
            services=record.services,
            engine_version=record.engine_version,
            overrides=record.overrides,
            phase_seconds=record.phase_seconds,
            capacity=record.capacity,
            telemetry=record.telemetry,
            measured_at=time.time(),
        )
        self._store(run_key(step.key, index), run.model_dump(mode="json"))
        self.measured += 1
        outcome.record = record
        self.report(state.winner, outcome, elapsed)
        return run

    def _store_result(
        self,
        planner: Planner,
        state: ExplainState,
        runs: dict[str, list[ExplainRun]],
        what: str,
        unit: str,
        *,
        stopped: str | None,
        partial: bool,
    ) -> Explanation:
        result = planner.explanation(
            runs,
            state,
            unit=unit,
            objective=what,
            stopped=stopped if not partial else "in progress",
        )
        own = self.ctx.study.study_name
        result.borrowed_own = sum(
            lent_by(r, own) for rs in planner.readable(runs, state).values() for r in rs
        )
        self._store(RESULT_ATTR, result.model_dump(mode="json"))
        return result

    def _store(self, key: str, value: Any) -> None:
        with deferred_interrupts():
            self.ctx.study.set_user_attr(key, value)
