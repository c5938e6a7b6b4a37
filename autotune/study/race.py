"""Which configuration to measure again next, and when to stop: the re-measure policies.

Pure functions of what is stored (no Optuna, no clock, no randomness), so the loop
(:mod:`autotune.study.remeasure`) and the offline replays (``benchmarks/winner_choice.py``)
run the same decisions, and a resumed phase decides exactly what the interrupted one would
have decided next from the same measurements.

Two policies, picked by the study's ``remeasure: policy:``:

* :class:`RacePolicy` (``race``, the default): the configurations ``best`` would choose
  from (:func:`autotune.results.winner_candidates`) race. Each one's interval comes from
  its measurements (the trial plus its re-measurements) and the study's run-to-run noise
  pooled over every configuration measured at least twice (so a configuration measured once
  gets the pooled noise): ``mean +- t(confidence, df) x sd x mean / sqrt(n)``. The leader is
  the configuration ``best`` ranks first (the highest lower 95% bound, then the mean: the
  same rule, :func:`autotune.results.conservative`). Contenders are the others whose upper
  bound is above the leader's lower bound x (1 + indifference): they could still beat it by
  more than the indifference zone. The race stops when there is none (the leader is
  separated from every other configuration, or whatever overlaps can beat it by less than
  the zone, so either is fine), when one configuration is left, or when the budget of
  restarts is spent. Otherwise the next restart goes to the leader or to the contender with
  the highest upper bound (the most overlap with the leader), whichever has fewer
  measurements (the wider interval; a tie goes to the leader): the repeats go where the top
  is statistically close, none to a configuration that is clearly behind.
* :class:`FixedPolicy` (``fixed``): the ``top_k`` configurations by mean, ``repeats`` more
  times each, round by round, drawn again after every run (a configuration that drops out of
  the top-k leaves it), at most ``3 x top_k x repeats`` runs per phase.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from autotune.results import conservative, half_width, noise_level

REPORTED_CONFIDENCE = 0.95
"""The interval ``best`` reports and ranks by; the race's leader is ranked by it too."""


@dataclass(frozen=True)
class Arm:
    """One configuration in the race: what is stored about it (and what is in flight)."""

    number: int
    """The trial that first measured it (what ``best`` shows and what is re-measured)."""
    values: tuple[float, ...]
    """Its full, feasible throughput measurements: the trial's own, then re-measurements."""
    repeats: frozenset[int] = field(default_factory=frozenset)
    """Re-measurement indices already taken: stored (whatever their outcome) or claimed by
    another worker."""
    pending: int = 0
    """Of :attr:`repeats`, those another worker is measuring (claimed, not stored yet)."""

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values) if self.values else 0.0

    @property
    def next_repeat(self) -> int:
        return max(self.repeats, default=0) + 1


@dataclass(frozen=True)
class Noise:
    """The study's pooled relative run-to-run standard deviation and its degrees of freedom
    (:func:`autotune.results.noise_level`); ``sd`` is ``None`` before any repeat."""

    sd: float | None
    df: int

    @classmethod
    def pooled(cls, arms: Sequence[Arm]) -> Noise:
        sd, df = noise_level([a.values for a in arms])
        return cls(sd, df)


@dataclass(frozen=True)
class Decision:
    """What to do next: re-measure ``measure`` = (trial, repeat), or stop (``None``)."""

    measure: tuple[int, int] | None
    reason: str
    leader: int | None = None
    """The trial in front now (``best``'s pick from the same measurements)."""
    challenger: int | None = None

    @property
    def stop(self) -> bool:
        return self.measure is None


@dataclass(frozen=True)
class Interval:
    arm: Arm
    lower: float
    upper: float


def ranked(arms: Sequence[Arm], noise: Noise | None = None) -> list[Arm]:
    """``arms`` (measured at least once) in ``best``'s order: the lower bound of the reported
    95% interval (:func:`autotune.results.conservative`, the study's pooled ``noise``;
    default: pooled over ``arms``), then the mean, then the order given (which carries
    ``best``'s remaining ties: the lower TPOT p99, the earlier trial)."""
    arms = [a for a in arms if a.n > 0]
    if noise is None:
        noise = Noise.pooled(arms)
    keys = [
        (
            -conservative(
                a.mean,
                half_width(a.mean, a.n, noise.sd, noise.df, confidence=REPORTED_CONFIDENCE),
            ),
            -a.mean,
            i,
        )
        for i, a in enumerate(arms)
    ]
    return [arms[i] for i in sorted(range(len(arms)), key=keys.__getitem__)]


def winner(arms: Sequence[Arm], noise: Noise | None = None) -> Arm | None:
    """The configuration ``best`` reports from these measurements (``None``: no arm)."""
    order = ranked(arms, noise)
    return order[0] if order else None


@dataclass(frozen=True)
class RacePolicy:
    """Race the close configurations until the leader is separated (see the module)."""

    budget: int
    """Restarts the race may spend in one round (re-measurements stored or in flight)."""
    confidence: float = 0.95
    """Two-sided level of each configuration's interval in the separation test."""
    indifference: float = 0.01
    """A contender must be able to beat the leader by more than this fraction."""

    def intervals(self, arms: Sequence[Arm], noise: Noise) -> list[Interval]:
        """Each arm's interval at :attr:`confidence`, in ``best``'s order (:func:`ranked`)."""
        out = []
        for arm in ranked(arms, noise):
            half = half_width(arm.mean, arm.n, noise.sd, noise.df, confidence=self.confidence)
            wide = math.inf if half is None else half
            out.append(Interval(arm=arm, lower=conservative(arm.mean, half), upper=arm.mean + wide))
        return out

    def decide(self, arms: Sequence[Arm], *, spent: int, noise: Noise | None = None) -> Decision:
        """The next re-measurement, or why the race is over.

        ``arms``: the candidates in ``best``'s order (ties keep it); ``spent``: restarts
        already used in this round (stored or in flight); ``noise``: the study's pooled
        noise (default: pooled over ``arms``).
        """
        arms = [a for a in arms if a.n > 0]
        if not arms:
            return Decision(None, "no configuration to race")
        ranked = self.intervals(arms, noise if noise is not None else Noise.pooled(arms))
        lead = ranked[0]
        leader = lead.arm.number
        if len(ranked) == 1:
            return Decision(None, f"#{leader} is the only candidate", leader=leader)
        threshold = lead.lower * (1.0 + self.indifference)
        contenders = [r for r in ranked[1:] if r.upper > threshold]
        if not contenders:
            second = max(ranked[1:], key=lambda r: r.upper)
            level = f"{100 * self.confidence:g}%"
            if second.upper < lead.lower:
                why = (
                    f"#{leader} is separated from every other configuration at {level} "
                    f"(the nearest, #{second.arm.number}, reaches {second.upper:,.1f}; "
                    f"#{leader}'s lower bound is {lead.lower:,.1f})"
                )
            else:
                why = (
                    f"#{leader} leads every other configuration or is within "
                    f"{100 * self.indifference:g}% of it at {level} (the nearest, "
                    f"#{second.arm.number}, reaches {second.upper:,.1f}; #{leader}'s lower "
                    f"bound is {lead.lower:,.1f}): either is fine"
                )
            return Decision(None, why, leader=leader, challenger=second.arm.number)
        # The contender with the most overlap (highest upper bound; ties: best's order).
        rival = max(contenders, key=lambda r: r.upper)
        challenger = rival.arm.number
        if spent >= self.budget:
            return Decision(
                None,
                f"the budget is spent ({spent} of {self.budget} restarts); #{leader} leads, "
                f"#{challenger} is still within reach",
                leader=leader,
                challenger=challenger,
            )
        pick = lead.arm if _load(lead.arm) <= _load(rival.arm) else rival.arm
        return Decision(
            (pick.number, pick.next_repeat),
            f"#{leader} leads, #{challenger} is within reach: measuring #{pick.number} "
            f"(n={pick.n})",
            leader=leader,
            challenger=challenger,
        )


def _load(arm: Arm) -> int:
    """Measurements an arm has or will have (in flight elsewhere): fewer = wider interval."""
    return arm.n + arm.pending


@dataclass(frozen=True)
class FixedPolicy:
    """The ``top_k`` configurations by mean, ``repeats`` more times each (round by round)."""

    top_k: int
    repeats: int

    @property
    def limit(self) -> int:
        """Runs one phase may take at most (the top-k is drawn again after every run)."""
        return 3 * self.top_k * self.repeats

    def plan(self, arms: Sequence[Arm]) -> list[tuple[int, int]]:
        """(trial, repeat) still to measure: repeat 1 of the whole top-k, then repeat 2 ..."""
        if self.top_k <= 0 or self.repeats <= 0:
            return []
        top = sorted((a for a in arms if a.n > 0), key=lambda a: (-a.mean, a.number))
        top = top[: self.top_k]
        return [
            (a.number, repeat)
            for repeat in range(1, self.repeats + 1)
            for a in top
            if repeat not in a.repeats
        ]

    def decide(self, arms: Sequence[Arm], *, spent: int) -> Decision:
        """``spent``: runs this phase has taken so far (measured or left to another worker)."""
        plan = self.plan(arms)
        if not plan:
            return Decision(None, f"the top {self.top_k} are measured {self.repeats} more time(s)")
        if spent >= self.limit:
            return Decision(None, f"{spent} runs: the phase's limit of {self.limit}")
        return Decision(plan[0], f"re-measurement {plan[0][1]} of the top {self.top_k}")
