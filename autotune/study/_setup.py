"""What the tuner derives from a study definition before its first trial.

The load the trials are measured with (the study's ``load:`` completed by the engine's
request quirks, the deployment's model and the SLOs on the servers' wall clock), the warm
start of a new study (read and translated before anything is created) and the correctness
reference kept as a study attribute.

Apart from :mod:`autotune.study.runner` because none of it is the loop: each is a pure
translation of the definition, the deployment and an earlier study, done once in
:class:`~autotune.study.runner.Tuner`'s constructor (the load also by benchmarks and tests
that build a tuner's load without running one).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna

from autotune.deployment import Deployment
from autotune.engines import BaseEngine
from autotune.errors import ConfigError
from autotune.loadgen import SLO, LoadSpec
from autotune.space import SearchSpace
from autotune.study.definition import StudyDefinition, WarmStartSettings
from autotune.study.storage import display_url, has_trials, storage_errors
from autotune.study.warm_start import WarmStartPlan, open_source, plan_warm_start

REFERENCE_ATTR = "reference_output"


class StudyReference:
    """The correctness reference, kept as a study attribute (the first healthy trial's)."""

    def __init__(self, study: optuna.Study) -> None:
        self.study = study

    def get(self) -> str | None:
        value = self.study.user_attrs.get(REFERENCE_ATTR)
        return None if value is None else str(value)

    def set(self, text: str) -> None:
        self.study.set_user_attr(REFERENCE_ATTR, text)


def _on_wall_clock(limit_ms: float | None, speedup: float) -> float | None:
    return None if limit_ms is None else limit_ms / speedup


def load_spec(definition: StudyDefinition, deployment: Deployment, engine: BaseEngine) -> LoadSpec:
    """The study's load, completed: what the study file leaves unsaid, the engine's
    request quirks decide; the served model is the deployment's, and the SLOs are on the
    wall clock of the servers (a simulated deployment runs ``sim_speedup`` x faster)."""
    load = definition.load
    slo = definition.slo
    speedup = deployment.sim_speedup
    quirks = engine.quirks
    given = {k: getattr(load, k) for k in load.given}
    if load.request_rate is not None:  # a rate of the modeled hardware
        given["request_rate"] = load.request_rate * speedup
    # Files the load names are relative to the study file, like its space and deployment.
    if load.tokenizer is not None:
        given["tokenizer"] = str(definition.resolve(Path(load.tokenizer)))
    dataset = load.dataset
    if dataset is not None and dataset.kind == "sharegpt":
        given["dataset"] = dataset.model_copy(update={"path": definition.resolve(dataset.path)})
    return LoadSpec.model_validate(
        {
            "prompt": quirks.prompt,
            "ignore_eos": quirks.ignore_eos,
            "require_done": quirks.require_done,
            **given,
            "model": deployment.model,
            "slo": SLO(
                ttft_ms=_on_wall_clock(slo.ttft_p99_ms, speedup),
                tpot_ms=_on_wall_clock(slo.tpot_p99_ms, speedup),
                e2e_ms=_on_wall_clock(slo.e2e_p99_ms, speedup),
            ),
        }
    )


def warm_start_plan(
    settings: WarmStartSettings | None,
    *,
    study_name: str,
    storage_url: str,
    space: SearchSpace,
    enqueue: Sequence[dict[str, Any]],
) -> WarmStartPlan | None:
    """The warm start of a new study, read and translated before anything is created (a
    missing earlier study is an error here); None without one, or when the study has
    trials already (a warm start only seeds a new study). ``enqueue``: the study's
    ``enqueue:`` as sampled values."""
    if settings is None:
        return None
    source_url = settings.storage or storage_url
    if settings.study == study_name and source_url == storage_url:
        raise ConfigError(
            f"study {study_name!r} cannot warm-start from itself", field="--warm-start-from"
        )
    if has_trials(storage_url, study_name):
        return None
    with storage_errors(source_url, f"reading study {settings.study!r}"):
        source = open_source(settings.study, source_url)
        return plan_warm_start(
            source,
            space=space,
            top=settings.top,
            storage=display_url(source_url),
            enqueued=[
                *([space.baseline_params()] if space.has_baseline else []),
                *enqueue,
            ],
        )
