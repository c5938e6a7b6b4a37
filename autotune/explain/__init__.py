"""Explaining a winner: what each change bought, the path to it, the smallest change worth
deploying.

The data flow: :class:`ChangeSet` (what the winner changed, grouped where conditions tie
levers together) -> :class:`Planner` (what to measure next, from what is stored) ->
:class:`Explanation` (stored in the study; the report draws it, ``best --minimal`` exports
its minimal winner). The measuring loop is :mod:`autotune.study.explainer`. Where the runs
span GPUs, :func:`gpu_blocked` reads each change again with the GPU as a block.
"""

from __future__ import annotations

from autotune.explain.blocks import GpuBlocks, gpu_blocked
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
    "GpuBlocks",
    "Interval",
    "Measure",
    "Measured",
    "Minimal",
    "PathStep",
    "Planner",
    "Variant",
    "gpu_blocked",
    "load_explanation",
    "load_runs",
    "load_state",
]
