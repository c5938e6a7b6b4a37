"""What the report reads from a study, once (:func:`read`), and hands to every section.

Each section is a function of :class:`ReportData` that returns its HTML, or ``None`` when
the study has nothing it needs (no curve, no explanation, too few trials for importances,
no stored fleet plan): a section is left out rather than shown empty.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import optuna

from autotune.errors import AutotuneError, StorageError
from autotune.explain import Explanation, GpuBlocks, gpu_blocked, load_explanation, load_runs
from autotune.export import redact_trial
from autotune.plan import FleetPlan, deployment_gpus, load_settings, make_plan
from autotune.report._common import Objective
from autotune.report._importances import importance_trials, param_importances
from autotune.results import (
    ConfigEstimate,
    Measurement,
    TrialResult,
    baseline_trial,
    best_estimate,
    config_estimates,
    load_remeasurements,
    load_results,
)


@dataclass(frozen=True)
class ReportData:
    """The study as every section sees it (trials redacted on the way in)."""

    study: optuna.Study
    results: list[TrialResult]
    objective: Objective
    best: TrialResult | None = None
    """The winner's trial (``best``'s pick), redacted."""
    baseline: TrialResult | None = None
    winner: ConfigEstimate | None = None
    estimates: list[ConfigEstimate] = field(default_factory=list)
    remeasured: list[Measurement] = field(default_factory=list)
    importances: dict[str, float] = field(default_factory=dict)
    """Optuna's importances over the feasible trials; empty when too few to mean anything."""
    explanation: Explanation | None = None
    explanation_error: str | None = None
    """Why a stored explanation could not be read (shown, not hidden)."""
    explanation_blocks: GpuBlocks | None = None
    """The explanation read with the GPU as a block, where its runs span GPUs."""
    gpus: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Deployment name -> (GPUs, file) for the trials' deployments that set ``gpus:``."""
    plan: FleetPlan | None = None
    """The fleet plan of the settings ``autotune plan`` stored last."""
    plan_error: str | None = None

    @property
    def name(self) -> str:
        return self.study.study_name


def read(study: optuna.Study, *, deployment_dirs: Sequence[Path] | None = None) -> ReportData:
    """Everything the sections draw from, read once.

    ``deployment_dirs``: where deployment files are looked up by the trials' deployment names
    for their GPU count (default: ``launchers/`` in the working directory, then the bundled
    ones)."""
    results = [redact_trial(r) for r in load_results(study)]
    winner, baseline = best_estimate(study), baseline_trial(study)
    gpus = deployment_gpus({r.deployment or "" for r in results}, search_dirs=deployment_dirs)
    explanation, explanation_error, blocks = None, None, None
    try:
        explanation = load_explanation(study)
        if explanation is not None:
            blocks = gpu_blocked(explanation, load_runs(study))
    except StorageError as exc:
        explanation_error = str(exc)
    plan, plan_error = None, None
    try:
        settings = load_settings(study)
        if settings is not None:
            plan = make_plan(study, settings, gpus=gpus)
    except AutotuneError as exc:
        plan_error = str(exc)
    return ReportData(
        study=study,
        results=results,
        objective=Objective.of(study),
        best=redact_trial(winner.trial) if winner is not None else None,
        baseline=redact_trial(baseline) if baseline is not None else None,
        winner=winner,
        estimates=config_estimates(study),
        remeasured=load_remeasurements(study),
        importances=param_importances(study) if importance_trials(results) else {},
        explanation=explanation,
        explanation_error=explanation_error,
        explanation_blocks=blocks,
        gpus=gpus,
        plan=plan,
        plan_error=plan_error,
    )
