"""Which configuration an explanation measures next, and what the measurements say.

Pure functions of what is stored (the runs, the frozen decisions), like the race
(:mod:`autotune.study.race`): the loop (:mod:`autotune.study.explainer`) asks
:meth:`Planner.next` after every measurement, so an interrupted explanation resumes exactly
where it stopped.

Three phases, in order:

1. **Ablation.** The winner, the baseline and the winner without each change
   (:meth:`ChangeSet.revert_alone`), ``repeats`` runs each, round by round (runs lent by
   other studies count; where a study lent enough that none of its configurations was
   measured here, one more run of the first of them: :meth:`Planner.anchor`). A change's
   contribution is the winner's mean minus the mean without it, with a 95% interval from
   the run-to-run noise pooled over every configuration measured (relative, as in
   ``best``). A configuration that fails in a way that belongs to it (out of memory, wrong
   output, rejected arguments: :data:`DETERMINISTIC_FAILURES`) is not run again, and the
   change is *required*; any other failure (a process killed, a timeout) is retried once.
   Then the changes are ordered by contribution (the required ones first) and the order is
   frozen in the state.
2. **Path** (``path: true``): the baseline plus the largest change, plus the next ... up to
   the winner, ``repeats`` runs each; a step the space refuses (a forbidden combination)
   is merged into the next one.
3. **Minimal winner** (``minimal: true``; :mod:`autotune.explain.elimination`): first, with
   ``drop_together``, one attempt to drop together every change the ablation could not tell
   from nothing, judged like a single drop; then backward elimination, smallest contribution
   first. Each change is dropped from the current set when the configuration without it
   keeps its conservative estimate (the lower 95% bound ``best`` ranks by) within
   ``tolerance`` of the winner's: ``lower(candidate) >= (1 - tolerance) x lower(winner)``.
   Where the ratio's 95% interval straddles ``1 - tolerance`` the candidate (and the
   winner, to stay balanced) get more runs, up to ``max_repeats``, before deciding. A
   candidate that fails, breaks an SLO in most runs or is refused by the space keeps the
   change; a winner that fails from fresh services has no minimal winner (there is nothing
   to stay within). A change whose revert alone (measured by the ablation) is below
   ``1 - tolerance`` of the winner with confidence is kept without measuring again: each
   restart costs minutes on hardware, and the changes dropped before it were each within
   the tolerance. Each decision is frozen in the state when taken.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from autotune.explain.changes import ChangeSet, Variant
from autotune.explain.elimination import eliminate
from autotune.explain.occasions import borrowed, by_occasion, describe, occasions, source_study
from autotune.explain.record import (
    Effect,
    ExplainState,
    Explanation,
    Interval,
    Measured,
    Minimal,
    PathStep,
)
from autotune.explain.settings import ExplainSettings
from autotune.explain.steps import (
    DETERMINISTIC_FAILURES,
    TRANSIENT_TRIES,
    Decide,
    Finished,
    Measure,
    Runs,
    RunStats,
    Step,
)
from autotune.results import bracket_width, half_width, noise_level, t_quantile

__all__ = [
    "DETERMINISTIC_FAILURES",
    "TRANSIENT_TRIES",
    "Decide",
    "Finished",
    "Measure",
    "Planner",
    "RunStats",
    "Runs",
    "Step",
]


class Planner:
    """The plan of one explanation: ``changes`` from the baseline to the winner."""

    def __init__(
        self,
        changes: ChangeSet,
        settings: ExplainSettings,
        *,
        winner: int,
        prior_noise: tuple[float | None, int] = (None, 0),
    ) -> None:
        self.changes = changes
        self.settings = settings
        self.winner_number = winner
        self.prior_noise = prior_noise
        self.winner = changes.variant(changes.names)
        self.baseline = changes.variant([])
        self.reverts = {name: changes.revert_alone(name) for name in changes.names}

    # ------------------------------------------------------------------ state

    def new_state(self) -> ExplainState:
        assert self.winner.key is not None
        return ExplainState(winner=self.winner_number, winner_key=self.winner.key)

    def stats(self, runs: Runs, key: str | None) -> RunStats:
        return RunStats.of(runs.get(key, ()) if key is not None else ())

    def noise(self, runs: Runs) -> tuple[float | None, int]:
        """Relative run-to-run noise pooled over every configuration measured twice or more
        (the prior, the study's own figure, until then)."""
        groups = [RunStats.of(r).values for r in runs.values()]
        widths = [
            w
            for rs in runs.values()
            for r in rs
            if r.value is not None and (w := bracket_width(r.capacity)) is not None
        ]
        sd, df = noise_level(groups, widths=widths)
        return (sd, df) if sd is not None else self.prior_noise

    # ------------------------------------------------------------------ what to measure

    def _round_robin(self, variants: Sequence[Variant], runs: Runs, repeats: int) -> Variant | None:
        for r in range(repeats):
            for v in variants:
                if v.key is None:
                    continue
                s = self.stats(runs, v.key)
                if not s.dead and s.n <= r:
                    return v
        return None

    def ablation_variants(self) -> list[Variant]:
        return [self.winner, self.baseline, *(v for v, _, _ in self.reverts.values())]

    def path_variants(self, order: Sequence[str]) -> list[Variant]:
        """Baseline + the first j changes of ``order`` for j = 1 .. k-1 (refused ones left
        out: their step merges into the next)."""
        return [self.changes.variant(order[:j]) for j in range(1, len(order))]

    @staticmethod
    def readable(runs: Runs, state: ExplainState) -> Runs:
        """``runs``, those measured here on an earlier machine marked as its occasion
        (:func:`~autotune.explain.occasions.by_occasion`), less those of an occasion the
        state left out (they read apart)."""
        runs = by_occasion(runs)
        if not state.left_out:
            return runs
        gone = set(state.left_out)
        return {
            key: [r for r in rs if r.source is None or source_study(r.source) not in gone]
            for key, rs in runs.items()
        }

    def next(self, runs: Runs, state: ExplainState) -> Step:
        s = self.settings
        if not self.changes.changes:
            return Finished("the winner is the baseline: nothing to explain")
        runs = self.readable(runs, state)
        pick = self._round_robin(self.ablation_variants(), runs, s.repeats)
        if pick is not None:
            return self.measure(pick, "ablation", runs)
        anchor = self.anchor(runs)
        if anchor is not None:
            return self.measure(
                anchor, "ablation", runs, note="beside the lent runs: the occasions compared"
            )
        for o in occasions(runs, self.prior_noise):
            if o.drift:
                return Decide(
                    state.model_copy(update={"left_out": [*state.left_out, o.study]}),
                    describe(o.model_copy(update={"left_out": True})),
                )
        if state.order is None:
            order = self.order(runs)
            return Decide(
                state.model_copy(update={"order": order}),
                "changes by measured contribution: " + ", ".join(order),
            )
        if s.path:
            path = [v for v in self.path_variants(state.order) if v.config is not None]
            pick = self._round_robin(path, runs, s.repeats)
            if pick is not None:
                return self.measure(pick, "path", runs)
        if s.minimal:
            return eliminate(self, runs, state)
        return Finished("done")

    def measure(self, v: Variant, phase: str, runs: Runs, *, note: str = "") -> Measure:
        assert v.key is not None and v.config is not None
        n = self.stats(runs, v.key).attempts
        why = f"{self.label(v)}, run {n + 1}" + (f" ({note})" if note else "")
        return Measure(v.key, v.config, phase, why)

    def anchor(self, runs: Runs) -> Variant | None:
        """A configuration of the ablation to measure once more, when a study lent runs of
        some of them and the explanation measured none of those itself (it lent enough of
        each): without a run of both kinds of one configuration, the drift between that
        study's occasion and this one is not measured (:mod:`autotune.explain.occasions`),
        and every contribution against a lent configuration would carry it unseen. The
        winner first, then the baseline, then the reverts; one restart per such study."""
        planned = [v for v in self.ablation_variants() if v.key is not None]
        lenders: dict[str, list[Variant]] = {}
        for v in planned:
            for study in sorted({source_study(r.source) for r in runs.get(v.key or "", ())
                                 if r.source is not None}):  # fmt: skip
                lenders.setdefault(study, []).append(v)
        for _, lent in sorted(lenders.items()):
            if any(r.source is None for v in lent for r in runs.get(v.key or "", ())):
                continue
            for v in lent:
                if not self.stats(runs, v.key).dead:
                    return v
        return None

    def label(self, v: Variant) -> str:
        if v.applied == frozenset(self.changes.names):
            return "the winner"
        if not v.applied:
            return "the baseline"
        missing = [n for n in self.changes.names if n not in v.applied]
        if len(missing) <= len(v.applied):
            return "the winner without " + ", ".join(missing)
        return "the baseline with " + ", ".join(n for n in self.changes.names if n in v.applied)

    def order(self, runs: Runs) -> list[str]:
        """The changes by measured contribution, largest first: required ones (without them
        the deployment fails or breaks an SLO) first, ones that could not be reverted last,
        ties in declaration order."""
        w = self.stats(runs, self.winner.key)

        def rank(item: tuple[int, str]) -> tuple[int, float, int]:
            i, name = item
            variant = self.reverts[name][0]
            without = self.stats(runs, variant.key)
            if variant.key is None:
                return (2, 0.0, i)
            if without.dead or without.breaks_slo:
                return (0, 0.0, i)
            return (1, -(w.mean - without.mean), i)

        return [name for _, name in sorted(enumerate(self.changes.names), key=rank)]

    # ------------------------------------------------------------------ elimination

    def elimination_order(self, state: ExplainState) -> list[str]:
        assert state.order is not None
        return list(reversed(state.order))

    def kept(self, state: ExplainState) -> list[str]:
        dropped = {d.change for d in state.decisions if d.action == "dropped"}
        return [n for n in self.changes.names if n not in dropped]

    @staticmethod
    def ratio(c: RunStats, w: RunStats, sd: float | None, df: int) -> Interval | None:
        """mean(c) / mean(w) with its 95% interval (log scale, relative noise ``sd``)."""
        if c.n == 0 or w.n == 0 or w.mean <= 0:
            return None
        r = c.mean / w.mean
        if sd is None or df < 1:
            return Interval(value=r)
        half = t_quantile(0.95, df) * sd * math.sqrt(1.0 / c.n + 1.0 / w.n)
        return Interval(value=r, low=r * math.exp(-half), high=r * math.exp(half))

    # ------------------------------------------------------------------ the result

    def measured(self, runs: Runs, key: str | None, sd: float | None, df: int) -> Measured:
        st = self.stats(runs, key)
        mean = None
        if st.n:
            half = half_width(st.mean, st.n, sd, df)
            mean = Interval(
                value=st.mean,
                low=None if half is None else st.mean - half,
                high=None if half is None else st.mean + half,
            )
        return Measured(
            key=key,
            n=st.n,
            values=list(st.values),
            mean=mean,
            failure=st.failure,
            infeasible=st.infeasible,
        )

    @staticmethod
    def difference(a: Measured, b: Measured, sd: float | None, df: int) -> Interval | None:
        """a's mean minus b's, with its 95% interval."""
        if a.mean is None or b.mean is None:
            return None
        d = a.mean.value - b.mean.value
        if sd is None or df < 1:
            return Interval(value=d)
        se = sd * math.sqrt(a.mean.value**2 / a.n + b.mean.value**2 / b.n)
        half = t_quantile(0.95, df) * se
        return Interval(value=d, low=d - half, high=d + half)

    def explanation(
        self,
        runs: Runs,
        state: ExplainState,
        *,
        unit: str,
        objective: str,
        stopped: str | None = None,
    ) -> Explanation:
        lent = occasions(by_occasion(runs), self.prior_noise, left_out=state.left_out)
        runs = self.readable(runs, state)
        sd, df = self.noise(runs)
        win = self.measured(runs, self.winner.key, sd, df)
        base = self.measured(runs, self.baseline.key, sd, df)
        effects = []
        for change in self.changes.changes:
            variant, reverted, note = self.reverts[change.name]
            without = self.measured(runs, variant.key, sd, df)
            contribution = self.difference(win, without, sd, df)
            notes = [n for n in (change.why_grouped, note) if n]
            effects.append(
                Effect(
                    change=change.name,
                    levers=list(change.levers),
                    winner=dict(change.winner),  # type: ignore[arg-type]
                    baseline=dict(change.baseline),  # type: ignore[arg-type]
                    reverted=list(reverted),
                    note="; ".join(notes) or None,
                    without=without,
                    contribution=contribution,
                    relative=(
                        contribution.value / win.mean.value
                        if contribution is not None and win.mean and win.mean.value
                        else None
                    ),
                    required=without.failure is not None
                    or (without.n > 0 and 2 * without.infeasible > without.n),
                )
            )
        path: list[PathStep] = []
        if state.order is not None and self.settings.path:
            previous, pending, note = base, [], None
            for j, name in enumerate(state.order, start=1):
                pending.append(name)
                v = self.changes.variant(state.order[:j]) if j < len(state.order) else self.winner
                if v.config is None:
                    note = f"{name} alone is refused here ({v.refused}): added with the next"
                    continue
                m = self.measured(runs, v.key, sd, df)
                path.append(
                    PathStep(
                        added=pending,
                        measured=m,
                        step=self.difference(m, previous, sd, df),
                        note=note,
                    )
                )
                previous, pending, note = m, [], None
        minimal = None
        if state.order is not None and self.settings.minimal:
            kept = self.kept(state)
            v = self.changes.variant(kept)
            decided = {d.change for d in state.decisions}
            m = self.measured(runs, v.key, sd, df)
            w_st = self.stats(runs, self.winner.key)
            m_st = self.stats(runs, v.key)
            minimal = Minimal(
                kept=kept,
                dropped=[d.change for d in state.decisions if d.action == "dropped"],
                config=dict(v.config or {}),  # type: ignore[arg-type]
                measured=m,
                ratio=self.ratio(m_st, w_st, sd, df),
                decisions=list(state.decisions),
                complete=decided >= set(self.changes.names),
            )
        complete = stopped is None and (
            state.order is not None and (minimal is None or minimal.complete)
        )
        return Explanation(
            winner=self.winner_number,
            unit=unit,
            objective=objective,
            tolerance=self.settings.tolerance,
            winner_config=dict(self.changes.winner_config),  # type: ignore[arg-type]
            baseline_config=dict(self.changes.baseline_config),  # type: ignore[arg-type]
            winner_measured=win,
            baseline_measured=base,
            noise_sd=sd,
            noise_df=df,
            effects=effects,
            path=path,
            minimal=minimal,
            runs=state.runs,
            borrowed=sum(1 for rs in runs.values() for r in rs if borrowed(r)),
            occasions=lent,
            complete=complete or not self.changes.changes,
            stopped=stopped,
        )
