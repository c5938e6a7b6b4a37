"""One trial without the study: a configuration in, a typed, scored record out.

:class:`TrialPipeline` runs the README's data flow for one configuration (check -> render ->
launch -> probe -> warm-up -> measure -> score) and :class:`TrialRecord` is what a trial
stores, the one model its writer and every reader share. Nothing here imports Optuna (an
import contract in pyproject.toml checks it).
"""

from __future__ import annotations

from autotune.trial.faults import FAULT_SCAN_LINES
from autotune.trial.measurement import Measured, MeasurePlan
from autotune.trial.pipeline import (
    HostFailure,
    PipelineSettings,
    Prepared,
    ProbeSettings,
    ReferenceOutput,
    Scorer,
    TrialPipeline,
    failed,
)
from autotune.trial.record import (
    MEASURED_PHASES,
    SCHEMA_VERSION,
    RemeasureRecord,
    ServiceRecord,
    TrialOutcome,
    TrialRecord,
)

__all__ = [
    "MeasurePlan",
    "Measured",
    "FAULT_SCAN_LINES",
    "MEASURED_PHASES",
    "SCHEMA_VERSION",
    "HostFailure",
    "PipelineSettings",
    "Prepared",
    "ProbeSettings",
    "ReferenceOutput",
    "RemeasureRecord",
    "Scorer",
    "ServiceRecord",
    "TrialOutcome",
    "TrialPipeline",
    "TrialRecord",
    "failed",
]
