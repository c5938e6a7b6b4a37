"""Before a winner is declared: the top configurations measured again, from fresh processes.

One measurement is one draw (each server process runs a little faster or slower), so the
best single run of a study is biased up. When the run reaches its trial target, the top-k
configurations are measured ``repeats`` more times, each from freshly started services;
those measurements are study attributes (``remeasure:N:R``), not trials, so trial counts,
the reuse index and the sampler never see them. They are journaled and resumed like trials:
what is stored is not measured again, so an interrupted phase continues where it stopped.
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
    best_estimate,
    format_estimate,
    load_remeasurements,
    remeasure_candidates,
    remeasure_key,
)
from autotune.study.claims import claim
from autotune.study.context import StudyContext, close_phases
from autotune.study.interrupts import deferred_interrupts
from autotune.study.journal import Entry
from autotune.study.record import redact_record
from autotune.study.storage import describe_storage_failure, display_url
from autotune.trial import TrialOutcome, TrialPipeline
from autotune.trial.record import RemeasureRecord

REMEASURE_ID_BASE = 1000
"""Journal key of re-measurement R of trial N: N * 1000 + R (repeats are at most 20)."""

Report = Callable[[int, TrialOutcome, float], None]


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

    def plan(self) -> list[tuple[int, int, dict[str, Any]]]:
        """(trial, repeat, config) still to measure: round by round over the top-k."""
        ctx = self.ctx
        settings = ctx.definition.remeasure
        if settings.top_k <= 0 or settings.repeats <= 0:
            return []
        done = {(m.of, m.repeat) for m in load_remeasurements(ctx.study)}
        top = remeasure_candidates(ctx.study, settings.top_k)
        return [
            (e.trial.number, repeat, ctx.space.complete(e.trial.config))
            for repeat in range(1, settings.repeats + 1)
            for e in top
            if (e.trial.number, repeat) not in done and e.trial.config
        ]

    def run(self) -> None:
        """Measure the plan; drawn again after each run: a configuration whose
        re-measurement failed leaves the top-k and the next one takes its place."""
        ctx = self.ctx
        plan = self.plan()
        if not plan:
            return
        self.active = True
        numbers = ", ".join(f"#{n}" for n in dict.fromkeys(n for n, _, _ in plan))
        ctx.progress.message(
            f"re-measuring the best configurations before declaring a winner: {len(plan)} "
            f"run(s) of {numbers}, each from freshly started services"
        )
        settings = ctx.definition.remeasure
        limit = 3 * settings.top_k * settings.repeats
        index = 0
        skipped: set[tuple[int, int]] = set()
        while plan and index < limit:
            index += 1
            number, repeat, config = plan[0]
            # Several workers reach the end together: each re-measurement is claimed, and
            # one another worker holds is left to it.
            key = f"autotune:claim:remeasure:{number}:{repeat}"
            # The worker's own number (no trial has it), the same after a restart: a claim
            # left by its interrupted predecessor is its own again.
            owner = (1 << 40) + zlib.crc32(ctx.worker_name.encode("utf-8"))
            if (
                not ctx.shared
                or ctx.db(
                    "claiming a re-measurement",
                    functools.partial(claim, ctx.study, key, owner),
                ).won
            ):
                self.one(number, repeat, config, index=index, total=index - 1 + len(plan))
            else:
                skipped.add((number, repeat))
            plan = [p for p in self.plan() if (p[0], p[1]) not in skipped]
        self.active = False
        best = best_estimate(ctx.study)
        if best is not None:
            ctx.progress.message(
                f"winner: trial #{best.trial.number}, {format_estimate(best)}; "
                f"conservative estimate {best.lower:,.1f} tok/s"
            )

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
                )
                if k in record.model_fields_set or k == "phase_seconds"
            },
        )
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
