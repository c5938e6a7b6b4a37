"""What the explanation's planner answers (:class:`Measure`, :class:`Decide`,
:class:`Finished`) and one configuration's runs summarized (:class:`RunStats`): shared by the
planner (:mod:`autotune.explain.planner`) and its elimination phase
(:mod:`autotune.explain.elimination`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autotune.explain.record import ExplainRun, ExplainState
from autotune.failures import Failure

Runs = Mapping[str, Sequence[ExplainRun]]


@dataclass(frozen=True)
class Measure:
    """Measure ``config`` once more from fresh services."""

    key: str
    config: dict[str, object]
    phase: str
    """``ablation``, ``path`` or ``minimal``."""
    why: str


@dataclass(frozen=True)
class Decide:
    """Store ``state`` (a decision was taken), then ask again."""

    state: ExplainState
    message: str


@dataclass(frozen=True)
class Finished:
    why: str
    complete: bool = True
    """False: the plan cannot go on (``why`` says why): the explanation stays incomplete."""


Step = Measure | Decide | Finished


DETERMINISTIC_FAILURES = frozenset(
    f.value
    for f in (
        Failure.cuda_oom,
        Failure.nccl_error,
        Failure.cuda_error,
        Failure.config_rejected,
        Failure.model_path_missing,
        Failure.compile_timeout,
        Failure.wrong_output,
        Failure.forbidden,
    )
)
"""Failures that belong to the configuration (it fails the same way every time); any other
(a process killed, a timeout, a port taken, a host gone) is tried again once."""
TRANSIENT_TRIES = 2
"""Failures of another class after which a configuration is not run again."""


@dataclass(frozen=True)
class RunStats:
    """One configuration's runs: what was measured, what failed."""

    values: tuple[float, ...]
    attempts: int
    failure: str | None
    """Why it is not run again (None while it may be)."""
    infeasible: int

    @classmethod
    def of(cls, runs: Sequence[ExplainRun]) -> RunStats:
        failed = [r for r in runs if r.value is None]
        final = [r for r in failed if r.failure in DETERMINISTIC_FAILURES]
        if not final and len(failed) >= TRANSIENT_TRIES:
            final = failed
        failure = None
        if final:
            first = final[0]
            failure = first.failure or "failed"
            if first.reason:
                failure = f"{failure}: {first.reason}"
            if len(failed) > 1:
                failure += f" ({len(failed)} of {len(runs)} runs failed)"
        return cls(
            values=tuple(v for r in runs if (v := r.value) is not None),
            attempts=len(runs),
            failure=failure,
            infeasible=sum(1 for r in runs if r.value is not None and not r.feasible),
        )

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values) if self.values else 0.0

    @property
    def dead(self) -> bool:
        """It failed: not run again."""
        return self.failure is not None

    @property
    def breaks_slo(self) -> bool:
        return self.n > 0 and 2 * self.infeasible > self.n
