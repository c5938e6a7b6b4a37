"""Before a winner is declared: the top configurations measured again, from fresh processes.

One measurement is one draw (each server process runs a little faster or slower), so the
best single run of a study is biased up. When the run reaches its trial target, the
configurations at the top are measured again, each from freshly started services, by the
study's policy (:mod:`autotune.study.race`: by default a race that spends its restarts
where the top is statistically close and stops once the leader is separated; ``fixed``: the
top-k, ``repeats`` more times each). Those measurements are study attributes
(``remeasure:N:R``), not trials, so trial counts, the reuse index and the sampler never see
them. They are journaled and resumed like trials: what is stored is not measured again, and
the policy decides from what is stored alone, so an interrupted phase continues exactly
where it stopped. With several workers each re-measurement is claimed
(``autotune:claim:remeasure:N:R``) before it is launched: one worker measures it, the others
count it as in flight and decide around it.
"""

from __future__ import annotations

import functools
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.errors import StorageError
from autotune.failpoints import failpoint
from autotune.results import (
    ConfigEstimate,
    best_estimate,
    config_estimates,
    format_estimate,
    load_remeasurements,
    objective_label,
    remeasure_candidates,
    remeasure_key,
    winner_candidates,
)
from autotune.study.claims import claim, remeasure_claim_key, remeasure_claims
from autotune.study.context import StudyContext, close_phases
from autotune.study.interrupts import deferred_interrupts
from autotune.study.journal import Entry
from autotune.study.race import Arm, Decision, FixedPolicy, Noise, RacePolicy
from autotune.study.record import redact_record, remeasured_changes
from autotune.study.storage import describe_storage_failure, display_url
from autotune.trial import TrialOutcome, TrialPipeline
from autotune.trial.record import RemeasureRecord

REMEASURE_ID_BASE = 1000
"""Journal key of re-measurement R of trial N: N * 1000 + R (R stays below 1000: repeats
are at most 20, a race's budget at most 500 per round, and a race stops before 1000)."""

Report = Callable[[int, TrialOutcome, float], None]


def _values(e: ConfigEstimate) -> tuple[float, ...]:
    """The full measurements behind an estimate's mean, in order (the trial's first)."""
    return tuple(m.throughput for m in e.measurements if m.full and m.throughput is not None)


class Remeasurer:
    """The re-measure phase of one worker."""

    def __init__(self, ctx: StudyContext, pipeline: TrialPipeline, *, report: Report) -> None:
        self.ctx = ctx
        self.pipeline = pipeline
        self.report = report
        self.active = False
        """True while the phase runs (an interruption then cut no trial short)."""
        self.stored = 0
        """Re-measurements stored by this run."""
        self.target: int | None = None
        """The trial target of this run: the race's round (its budget is per target)."""
        self.decision: Decision | None = None
        """The policy's last decision (why the phase stopped, once it has)."""

    @property
    def owner(self) -> int:
        """The worker's own claim number (no trial has it), the same after a restart: a
        claim left by its interrupted predecessor is its own again."""
        return (1 << 40) + zlib.crc32(self.ctx.worker_name.encode("utf-8"))

    def plan(self) -> list[tuple[int, int, dict[str, Any]]]:
        """(trial, repeat, config) still to measure under ``policy: fixed``: round by round
        over the top-k (the race decides one re-measurement at a time: :meth:`decide`)."""
        settings = self.ctx.definition.remeasure
        policy = FixedPolicy(settings.top_k, settings.repeats)
        arms, configs = self._fixed_arms(set())
        return [(n, r, configs[n]) for n, r in policy.plan(arms)]

    def _fixed_arms(
        self, skipped: set[tuple[int, int]]
    ) -> tuple[list[Arm], dict[int, dict[str, Any]]]:
        """The top-k by mean (``remeasure_candidates``) with the repeats taken of each."""
        ctx = self.ctx
        done: dict[int, set[int]] = {}
        for m in load_remeasurements(ctx.study):
            done.setdefault(m.of, set()).add(m.repeat)
        for number, repeat in skipped:
            done.setdefault(number, set()).add(repeat)
        estimates = remeasure_candidates(ctx.study, ctx.definition.remeasure.top_k)
        arms, configs = [], {}
        for e in estimates:
            if not e.trial.config:
                continue
            values = _values(e)
            arms.append(
                Arm(e.trial.number, values, repeats=frozenset(done.get(e.trial.number, ())))
            )
            configs[e.trial.number] = ctx.space.complete(e.trial.config)
        return arms, configs

    def _race_arms(
        self, skipped: set[tuple[int, int]]
    ) -> tuple[list[Arm], dict[int, dict[str, Any]], int, Noise]:
        """The race's candidates in ``best``'s order, their configs, the restarts this round
        has spent (stored or in flight elsewhere) and the study's pooled noise."""
        ctx = self.ctx
        stored = load_remeasurements(ctx.study)
        done: dict[int, set[int]] = {}
        for m in stored:
            done.setdefault(m.of, set()).add(m.repeat)
        # In flight elsewhere: claimed by another worker (or lost to one just now), not
        # stored. Counted against the budget and as the configuration's next measurement,
        # so workers racing together spend one budget and spread over the close ones.
        others = set(skipped)
        if ctx.shared:
            mine = self.owner
            claims = ctx.db("reading re-measurement claims", lambda: remeasure_claims(ctx.study))
            others |= {key for key, owner in claims.items() if owner != mine}
        in_flight: dict[int, int] = {}
        for number, repeat in sorted(others):
            if repeat not in done.get(number, set()):
                in_flight[number] = in_flight.get(number, 0) + 1
                done.setdefault(number, set()).add(repeat)
        spent = sum(1 for m in stored if self.target is None or m.target == self.target)
        spent += sum(in_flight.values())
        estimates = config_estimates(ctx.study)
        noise = Noise(estimates[0].noise_sd, estimates[0].noise_df) if estimates else Noise(None, 0)
        arms, configs = [], {}
        for e in winner_candidates(ctx.study, estimates):
            if not e.trial.config:
                continue
            number = e.trial.number
            values = _values(e)
            arms.append(
                Arm(
                    number,
                    values,
                    repeats=frozenset(done.get(number, ())),
                    pending=in_flight.get(number, 0),
                )
            )
            configs[number] = ctx.space.complete(e.trial.config)
        return arms, configs, spent, noise

    def decide(
        self, skipped: set[tuple[int, int]], *, runs: int
    ) -> tuple[Decision, dict[int, dict[str, Any]], int]:
        """The policy's next step from what is stored (and ``skipped``: claimed by other
        workers); ``runs``: re-measurements this phase has taken. (decision, configs, how
        many more runs the phase may take at most)."""
        settings = self.ctx.definition.remeasure
        if settings.policy == "fixed":
            fixed = FixedPolicy(settings.top_k, settings.repeats)
            arms, configs = self._fixed_arms(skipped)
            decision = fixed.decide(arms, spent=runs)
            return decision, configs, len(fixed.plan(arms))
        race = RacePolicy(
            budget=settings.race_budget,
            confidence=settings.confidence,
            indifference=settings.indifference,
        )
        arms, configs, spent, noise = self._race_arms(skipped)
        decision = race.decide(arms, spent=spent, noise=noise)
        if decision.measure is not None and decision.measure[1] >= REMEASURE_ID_BASE:
            decision = Decision(
                None,
                f"trial #{decision.measure[0]} has {REMEASURE_ID_BASE - 1} re-measurements",
                leader=decision.leader,
                challenger=decision.challenger,
            )
        return decision, configs, max(0, race.budget - spent)

    def run(self, *, target: int | None = None) -> None:
        """Measure what the policy asks for, one re-measurement at a time, deciding again
        after each (a configuration whose re-measurement failed leaves the candidates)."""
        ctx = self.ctx
        settings = ctx.definition.remeasure
        self.target = target
        self.decision = None
        if not settings.enabled:
            return
        skipped: set[tuple[int, int]] = set()
        decision, configs, left = self.decide(skipped, runs=0)
        self.decision = decision
        if decision.measure is None:
            return
        self.active = True
        if settings.policy == "fixed":
            plan = self.plan()
            numbers = ", ".join(f"#{n}" for n in dict.fromkeys(n for n, _, _ in plan))
            ctx.progress.message(
                f"re-measuring the best configurations before declaring a winner: {len(plan)} "
                f"run(s) of {numbers}, each from freshly started services"
            )
        else:
            ctx.progress.message(
                "racing the best configurations before declaring a winner: up to "
                f"{left} restart(s), each from freshly started services, until the leader is "
                f"separated at {100 * settings.confidence:g}% ({decision.reason})"
            )
        index = 0
        while decision.measure is not None:
            number, repeat = decision.measure
            changed = self._env_changes(number, configs[number])
            if changed:
                decision = Decision(
                    None,
                    f"trial #{number} ran in another environment ({'; '.join(changed)})",
                    leader=decision.leader,
                    challenger=decision.challenger,
                )
                self.decision = decision
                ctx.progress.message(
                    f"re-measuring stops: {decision.reason}; its runs here would be pooled "
                    "with a measurement under other variables. Run with the variables as then "
                    "to re-measure it"
                )
                break
            index += 1
            # Several workers reach the end together: each re-measurement is claimed, and
            # one another worker holds is left to it.
            key = remeasure_claim_key(number, repeat)
            if (
                not ctx.shared
                or ctx.db(
                    "claiming a re-measurement",
                    functools.partial(claim, ctx.study, key, self.owner),
                ).won
            ):
                self.one(number, repeat, configs[number], index=index, total=index - 1 + left)
            else:
                skipped.add((number, repeat))
            decision, configs, left = self.decide(skipped, runs=index)
            self.decision = decision
        self.active = False
        best = best_estimate(ctx.study)
        if best is not None:
            why = f"; {decision.reason}" if settings.policy == "race" else ""
            unit = objective_label(best.trial.metric_names)[1]
            ctx.progress.message(
                f"winner: trial #{best.trial.number}, {format_estimate(best, unit)}; "
                f"conservative estimate {best.lower:,.1f} {unit}{why}"
            )

    def _env_changes(self, number: int, config: dict[str, Any]) -> list[str]:
        """How the variables ``config``'s services would inherit now differ from those trial
        ``number`` or one of its re-measurements ran with (empty: the same, or not
        recorded)."""
        prepared = self.pipeline.prepare(config, is_baseline=False)
        if isinstance(prepared, TrialOutcome):
            return []
        return remeasured_changes(self.ctx.study, number, prepared.record)

    def one(
        self, number: int, repeat: int, config: dict[str, Any], *, index: int, total: int
    ) -> None:
        ctx = self.ctx
        t0 = time.monotonic()
        ctx.progress.trial_started(
            number=number, index=index, total=total, config=config, kind="re-measure"
        )
        outcome = self.pipeline.evaluate(config, is_baseline=False, fresh=True)
        elapsed = close_phases(outcome, t0)
        outcome.record = redact_record(outcome.record)
        record = outcome.record
        stored = RemeasureRecord(
            of=number,
            repeat=repeat,
            target=self.target,
            values=outcome.values,
            constraints=outcome.constraints,
            feasible=outcome.feasible and outcome.failure is None,
            **{
                k: getattr(record, k)
                for k in (
                    "metrics",
                    "phase_seconds",
                    "failure",
                    "reason",
                    "stop_reason",
                    "sim_speedup",
                    "restarted",
                    "capacity",
                    "telemetry",
                    "startup",
                )
                if k in record.model_fields_set or k == "phase_seconds"
            },
        )
        if record.services:  # redacted above, as the trial's own record
            stored.inherited_env = {n: s.inherited_env for n, s in record.services.items()}
        attrs = stored.to_attrs()
        entry = number * REMEASURE_ID_BASE + repeat
        with deferred_interrupts():
            try:
                journaled: Path | None = ctx.remeasure_journal.save(
                    entry,
                    number=number,
                    outcome=Entry(
                        values=outcome.values, constraints=outcome.constraints, attrs=attrs
                    ),
                )
            except OSError:
                journaled = None
            failpoint("journal.saved")
            try:
                ctx.study.set_user_attr(remeasure_key(number, repeat), attrs)
            except Exception as exc:
                kept = (
                    f"it is kept in {journaled} and the next `autotune run` records it"
                    if journaled
                    else "the next `autotune run` measures it again"
                )
                why = describe_storage_failure(exc, url=ctx.storage_url)
                raise StorageError(
                    f"could not record re-measurement {repeat} of trial #{number} in "
                    f"{display_url(ctx.storage_url)}: {why}. {kept}"
                ) from exc
            failpoint("trial.told")
            if journaled is not None:
                ctx.remeasure_journal.discard(entry)
        self.stored += 1
        self.report(number, outcome, elapsed)
