"""What autotune leaves on the hosts: ``apply`` installs a trial for good, ``restore`` undoes
everything autotune did there.

The launch, render and results modules are imported inside the commands: they load pydantic,
PyYAML and Optuna (130-180 ms), which ``autotune --help`` must not pay.
"""

from __future__ import annotations

from pathlib import Path

import typer

from autotune.cli._common import (
    StorageOpt,
    StudyOpt,
    check_study,
    deployment_context,
    friendly,
    open_existing,
    say,
)
from autotune.errors import AutotuneError, ConfigError


@friendly
def restore(
    study: str = StudyOpt,
    study_file: Path | None = typer.Option(None, "--study-file"),
) -> None:
    """Leave the hosts as found: remove autotune's drop-ins, stop what it started."""
    from autotune.launch.factory import make_launcher
    from autotune.render import render

    check_study(study)
    _, space, deployment, run_dir = deployment_context(study, study_file)
    specs = render(space, deployment, space.baseline_config(), run_dir=run_dir)
    launcher = make_launcher(deployment, run_dir=run_dir)
    try:
        done = launcher.restore(specs, on_event=lambda s, e: say(f"{s}: {e}"))
    finally:
        launcher.detach()
    say(f"restored: {', '.join(done) or 'nothing to do'}")


@friendly
def apply(
    trial: int | None = typer.Option(None, "--trial", help="Trial number to install."),
    best_: bool = typer.Option(False, "--best", help="Install the best feasible trial."),
    study: str = StudyOpt,
    storage: str | None = StorageOpt,
    study_file: Path | None = typer.Option(None, "--study-file"),
) -> None:
    """Install a trial's configuration for good (services keep running after autotune exits)."""
    from autotune.launch.factory import make_launcher
    from autotune.render import render
    from autotune.results import TrialResult, best_trial, own_trials

    check_study(study)
    if (trial is None) == (not best_):
        raise ConfigError("give exactly one of --trial N or --best", field="apply")
    opened = open_existing(study, storage)
    if best_:
        chosen = best_trial(opened)
        if chosen is None:
            raise AutotuneError(f"study {study!r} has no feasible completed trial yet")
    else:
        numbers = [t.number for t in own_trials(opened)]  # not those a warm start carried
        if trial not in numbers:
            raise ConfigError(
                f"no trial {trial}", field="--trial", allowed=numbers[-20:] or ["(none)"]
            )
        chosen = TrialResult.from_frozen(opened.trials[trial], metric_names=opened.metric_names)
    if not chosen.config:
        raise AutotuneError(f"trial {chosen.number} has no stored configuration")
    _, space, deployment, run_dir = deployment_context(study, study_file)
    specs = render(space, deployment, space.complete(chosen.config), run_dir=run_dir)
    launcher = make_launcher(deployment, run_dir=run_dir)
    try:
        result = launcher.apply(specs, on_event=lambda s, e: say(f"{s}: {e}"))
    except BaseException:
        launcher.close()
        raise
    launcher.detach()
    say(
        f"trial {chosen.number} installed ({', '.join(result.restarted) or 'nothing restarted'}); "
        f"endpoint {deployment.endpoint_url(specs)}; undo with `autotune restore --study {study}`"
    )
