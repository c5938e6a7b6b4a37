"""Does this shell give the services the environment the study measured them in?

A local service inherits autotune's environment, and some of what it inherits changes what
is measured (``VLLM_WORKER_MULTIPROC_METHOD``, ``NCCL_*``, ``CUDA_VISIBLE_DEVICES``: the
variables :mod:`autotune.trial.inherited_env` selects and every trial records). Before a
session measures anything, and whenever ``autotune status`` is asked, the variables the
services would inherit now are compared with those of the study's newest trial that recorded
them: an identical configuration measured under other variables is measured again, not
reused, and a re-measurement under them is not pooled (:mod:`autotune.study.remeasure`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState
from pydantic import BaseModel, ConfigDict, Field

from autotune.deployment import Deployment
from autotune.engines import BaseEngine, get_engine
from autotune.render import render
from autotune.results import own_trials
from autotune.space import SearchSpace
from autotune.study.record import trial_changes
from autotune.trial.pipeline import service_records
from autotune.trial.record import ServiceRecord, TrialRecord


class EnvironmentCheck(BaseModel):
    """The variables the services would inherit now against the newest trial's."""

    model_config = ConfigDict(frozen=True)

    trial: int | None = None
    """The newest complete trial that recorded its services' inherited variables; ``None``:
    none did (the study predates trial schema 8, or every service runs on another host)."""
    changes: list[str] = Field(default_factory=list)
    """How they differ, one line each (``SERVICE: NAME: fork then, unset now``); empty: the
    same."""
    error: str | None = None
    """Why nothing was compared (the study file could not be read)."""


def space_engines(space: SearchSpace) -> dict[str, BaseEngine]:
    """The engine plug-in of each of ``space``'s services, at the version it names."""
    return {
        service: get_engine(space.engine_ref(service).name, space.engine_ref(service).version)
        for service in space.services
    }


def shell_services(
    space: SearchSpace,
    deployment: Deployment,
    *,
    run_dir: Path,
    environ: Mapping[str, str] | None = None,
) -> dict[str, ServiceRecord]:
    """What the services of ``space``'s baseline would run and inherit from ``environ``
    (default: this process's environment), as a trial records them."""
    specs = render(space, deployment, space.baseline_config(), run_dir=run_dir)
    return service_records(specs, space_engines(space), environ=environ)


def check_environment(
    study: optuna.Study,
    services: Mapping[str, ServiceRecord],
    *,
    trials: Sequence[FrozenTrial] | None = None,
) -> EnvironmentCheck:
    """``services``' inherited variables against those of ``study``'s newest complete trial
    that recorded them (``trials``: the study's own trials, when already read)."""
    every = own_trials(study, states=(TrialState.COMPLETE,)) if trials is None else trials
    complete = (t for t in every if t.state == TrialState.COMPLETE)
    for trial in sorted(complete, key=lambda t: t.number, reverse=True):
        stored = trial.user_attrs.get("services") or {}
        if any(isinstance(s, dict) and s.get("inherited_env") is not None for s in stored.values()):
            now = TrialRecord(services=dict(services))
            return EnvironmentCheck(trial=trial.number, changes=trial_changes(trial, now))
    return EnvironmentCheck()


def environment_line(check: EnvironmentCheck) -> str:
    """One line saying what the check found (``autotune status``; ``autotune run`` at a
    session's start, where they differ)."""
    if check.error is not None:
        return f"not compared: {check.error}"
    if check.trial is None:
        return "not compared: no trial recorded the variables its services inherited"
    if not check.changes:
        return f"as trial #{check.trial}'s (the variables its services inherited)"
    return (
        f"differs from trial #{check.trial}'s ({'; '.join(check.changes)}): identical "
        "configurations are measured again, not reused, and re-measurements stop; set the "
        "variables as then to compare like with like"
    )
