"""``autotune run``: the tuning loop, started or resumed.

The study modules are imported inside the command: they load Optuna and SQLAlchemy
(~330 ms), which ``autotune --help`` must not pay.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import typer

from autotune.cli._common import (
    StorageOpt,
    StudyFileOpt,
    StudyOpt,
    check_study,
    console,
    err_console,
    friendly,
    shown,
    storage_url,
    study_file_path,
)
from autotune.errors import ConfigError

_WORKER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:-]{0,99}")


@friendly
def run(
    trials: int = typer.Option(
        200, "--trials", min=1, help="Run until the study holds this many completed trials."
    ),
    study: str = StudyOpt,
    storage: str | None = StorageOpt,
    study_file: Path | None = StudyFileOpt,
    sampler: str | None = typer.Option(
        None,
        "--sampler",
        help="tpe (default), random, grid, qmc, nsga2; gp, catcma, rfbo with their extras.",
    ),
    seed: int | None = typer.Option(None, "--seed", min=0, max=2**32 - 1, help="Sampler seed."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress output."),
    deployment: Path | None = typer.Option(
        None,
        "--deployment",
        help="Deployment file this worker drives (default: the study file's). Several "
        "workers with their own deployments share one study on PostgreSQL.",
    ),
    worker: str | None = typer.Option(
        None,
        "--worker",
        help="This worker's name in the study (default HOST/DEPLOYMENT); the same name "
        "resumes its own interrupted trial.",
    ),
    warm_start_from: str | None = typer.Option(
        None,
        "--warm-start-from",
        metavar="STUDY",
        help="Start a new study from an earlier one: its best configurations are tried "
        "right after the baseline and its failed launches teach the sampler (both "
        "translated to this study's space). Only when the study is new; overrides the "
        "study file's warm_start.study.",
    ),
    warm_start_storage: str | None = typer.Option(
        None,
        "--warm-start-storage",
        metavar="URL",
        help="Storage of the --warm-start-from study (default: --storage if given, else "
        "sqlite:///studies/STUDY.db).",
    ),
) -> None:
    """Run (or resume) a study: the same command continues where it stopped.

    Started on several machines with the same --storage and --study, the workers share the
    study: no configuration is measured twice, a worker that dies is noticed and its trial
    re-queued. See `autotune status`.
    """
    from autotune.study.definition import SAMPLERS, load_study_definition
    from autotune.study.progress import make_progress
    from autotune.study.runner import Tuner

    check_study(study)
    if sampler is not None and sampler not in SAMPLERS:
        raise ConfigError(f"unknown sampler {sampler!r}", field="--sampler", allowed=SAMPLERS)
    if worker is not None and not _WORKER_NAME.fullmatch(worker):
        raise ConfigError(
            f"worker name {worker!r} is not allowed",
            field="--worker",
            allowed="1-100 characters: letters, digits, '.', '_', '-', '/', ':'",
        )
    path = study_file_path(study, study_file)
    definition = load_study_definition(path)

    url = storage_url(study, storage)
    warm = _warm_start(definition, warm_start_from, warm_start_storage, storage)
    progress = make_progress(quiet=quiet)
    try:
        tuner = Tuner(
            definition=definition,
            study_name=study,
            storage_url=url,
            sampler=sampler,
            seed=seed,
            progress=progress,
            worker=worker,
            deployment=deployment,
            warm_start=warm,
        )
        who = f" as worker {tuner.worker_name!r}" if worker or tuner.shared else ""
        progress.message(
            f"study {study!r} on {shown(url)}{who}: {tuner.completed_count()} completed "
            f"trials, target {trials}"
        )
        summary = tuner.run(n_trials=trials)
    finally:
        progress.close()
    if summary.interrupted:
        cut = (
            "the re-measurement cut short stored nothing and is run again"
            if summary.in_remeasure
            else "a trial cut short is recorded as FAIL (interrupted) and its config is retried"
        )
        if summary.left_running:
            services = (
                f"Left running: {', '.join(summary.left_running)} (the clean-up was cut short); "
                f"stop them with `autotune restore --study {study}` (the next run also stops them "
                "first)."
            )
        else:
            stopped = ", ".join(summary.stopped) or "none were running"
            services = (
                f"Services stopped: {stopped}; nothing autotune started is left running. "
                f"To undo flag and drop-in changes on the hosts: autotune restore --study {study}."
            )
        err_console.print(
            f"interrupted after {summary.trials_run} trials this run "
            f"({summary.trials_total} in the study). The study is consistent: {cut}. {services} "
            f"Resume with the same command: autotune run --trials {trials} --study {study}",
            soft_wrap=True,
            highlight=False,
            markup=False,
        )
        raise typer.Exit(code=130)
    again = f" and {summary.remeasured} re-measurements" if summary.remeasured else ""
    if summary.explained:
        again += f" and {summary.explained} explanation runs (autotune explain --show)"
    console.print(
        f"done: {summary.trials_run} trials{again} run in {summary.seconds:.0f}s; study holds "
        f"{summary.trials_total}. Next: autotune best --study {study}",
        soft_wrap=True,
        highlight=False,
        markup=False,
    )


def _warm_start(
    definition: Any, study: str | None, storage: str | None, run_storage: str | None
) -> Any:
    """The warm start this run asks for: the options over the study file's ``warm_start:``,
    its storage resolved (the option, the file's, ``--storage``, else the earlier study's
    default SQLite file); None without one."""
    from autotune.study.definition import WarmStartSettings
    from autotune.study.storage import check_study_name

    given = definition.warm_start
    if study is None and given is None:
        if storage is not None:
            raise ConfigError(
                "--warm-start-storage needs --warm-start-from STUDY (or warm_start: in the "
                "study file)",
                field="--warm-start-storage",
            )
        return None
    name = study if study is not None else given.study
    check_study_name(name, field="--warm-start-from")
    from_file = given.storage if given is not None and given.study == name else None
    url = storage or from_file or storage_url(name, run_storage)
    return WarmStartSettings(study=name, storage=url, top=given.top if given is not None else 5)
