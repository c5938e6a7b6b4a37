"""Explaining a winner: what each change bought, the path to it, the smallest change worth
deploying.

The data flow: :class:`ChangeSet` (what the winner changed, grouped where conditions tie
levers together) -> :class:`Planner` (what to measure next, from what is stored) ->
:class:`Explanation` (stored in the study; the report draws it, ``best --minimal`` exports
its minimal winner). The measuring loop is :mod:`autotune.study.explainer`.
"""

from __future__ import annotations

from autotune.explain.changes import Change, ChangeSet, Variant
from autotune.explain.planner import Decide, Finished, Measure, Planner
from autotune.explain.record import (
    Effect,
    ExplainRun,
    ExplainState,
    Explanation,
    Interval,
    Measured,
    Minimal,
    PathStep,
    load_explanation,
    load_runs,
    load_state,
)
from autotune.explain.settings import ExplainSettings

__all__ = [
    "Change",
    "ChangeSet",
    "Decide",
    "Effect",
    "ExplainRun",
    "ExplainSettings",
    "ExplainState",
    "Explanation",
    "Finished",
    "Interval",
    "Measure",
    "Measured",
    "Minimal",
    "PathStep",
    "Planner",
    "Variant",
    "load_explanation",
    "load_runs",
    "load_state",
]
