"""How an explanation measures: the study file's ``explain:`` section and its CLI flags."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ExplainSettings(BaseModel):
    """Ablation of the winner, the path to it and the minimal winner (``autotune explain``).

    Every configuration is measured ``repeats`` times from freshly started services, round
    by round (the winner, the baseline, then the winner without each change), so a drift
    of the machine falls on all of them alike. A removal the elimination cannot decide
    (the ratio's interval straddles the tolerance) gets more runs, up to ``max_repeats``.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    """Run it at the end of ``autotune run``, once the winner is declared."""
    repeats: int = Field(3, ge=1, le=20)
    max_repeats: int = Field(6, ge=1, le=50)
    tolerance: float = Field(0.03, gt=0, lt=0.5)
    """The minimal winner's lower bound may be this fraction below the winner's."""
    path: bool = True
    """Measure the path from the baseline to the winner, adding changes largest first."""
    minimal: bool = True
    """Search the smallest set of changes within ``tolerance`` (backward elimination)."""
    drop_together: bool = True
    """Begin the elimination by trying to drop every change the ablation measured as
    negligible at once (:mod:`autotune.explain.elimination`): one candidate instead of a
    close call per change."""
    own_runs: bool = False
    """Borrow the fresh-start runs the study itself took of the configurations the
    explanation measures, never the winner's, at most ``repeats - 1`` of each
    (:mod:`autotune.explain.borrowed`: a run of a configuration that lost leans low, so it
    is asked for, not the default)."""
    budget: int | None = Field(None, ge=0, le=10_000)
    """At most this many restarts per invocation (None: what the plan needs); the next
    invocation resumes. 0 measures nothing and writes the explanation of the runs stored."""

    @model_validator(mode="after")
    def _repeats_in_order(self) -> ExplainSettings:
        if self.max_repeats < self.repeats:
            raise ValueError(
                f"max_repeats ({self.max_repeats}) must be at least repeats ({self.repeats})"
            )
        return self
