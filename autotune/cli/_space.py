"""``autotune space check`` and ``space render``: a search space on its deployments,
without launching anything.

The space, deployment, engine and dry-run modules are imported inside the commands: they
load pydantic and PyYAML (100-170 ms), which ``autotune --help`` must not pay.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

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


def _space_deployments(path: Path, space: Any, deployments: list[Path] | None) -> dict[str, Any]:
    """Deployment file -> Deployment: the given ones; else those of every study under
    ``studies/`` whose space is ``path``, and every deployment under ``launchers/`` that has
    the space's services and runs them with the space's engine."""
    from autotune.deployment import load_deployment
    from autotune.engines import engine_for_command
    from autotune.study.definition import load_study_definition

    if deployments:
        return {str(d): load_deployment(d) for d in deployments}
    here = Path.cwd()

    def shown(file: Path) -> str:
        file = file.resolve()
        return str(file.relative_to(here)) if file.is_relative_to(here) else str(file)

    found: dict[str, Any] = {}
    target = path.resolve()
    for study_file in sorted(Path("studies").glob("*.yaml")):
        try:
            definition = load_study_definition(study_file)
        except AutotuneError:
            continue
        if definition.resolve(definition.space) == target:
            file = definition.resolve(definition.deployment)
            if shown(file) not in found:  # several studies may share one deployment
                found[shown(file)] = load_deployment(file)
    for file in sorted(Path("launchers").glob("*.yaml")):
        if shown(file) in found:  # a study's deployment, loaded above
            continue
        try:
            candidate = load_deployment(file)
        except AutotuneError:
            continue
        roles = candidate.roles()
        if not set(space.services) <= set(roles):
            continue
        runs = [
            (engine_for_command(candidate.services[name].command), space.engine_ref(role).name)
            for role in space.services
            for name in roles[role]
        ]
        if all(r is not None and r.name == wanted for r, wanted in runs):
            found[shown(file)] = candidate
    return found


@friendly
def space_check(
    path: Path = typer.Argument(..., help="A search-space YAML file."),
    deployment: list[Path] | None = typer.Option(
        None,
        "--deployment",
        help="Deployment to render on (repeatable); default: the deployments of the studies "
        "under studies/ that use this space.",
    ),
    sample: int = typer.Option(200, "--sample", min=0, help="Sampled configurations to check."),
    seed: int = typer.Option(0, "--seed", help="Seed of the sampled configurations."),
) -> None:
    """Validate a search space, then render its baseline and sampled configurations on each
    deployment and check every command against the engine's real options (its manifest)."""
    from autotune.dryrun import check_commands
    from autotune.engines import get_engine
    from autotune.space import load_space
    from autotune.space.summary import summarize

    space = load_space(path)
    say(str(summarize(space)))
    targets = _space_deployments(path, space, deployment)
    if not targets:
        say(
            "no deployment given and no study under studies/ uses this space: only the "
            "space's own flags were checked (give --deployment FILE)"
        )
        return
    findings, checked, unchecked = check_commands(space, targets, samples=sample, seed=seed)
    engines = [
        get_engine(space.engine_ref(s).name, space.engine_ref(s).version) for s in space.services
    ]
    against = ", ".join(dict.fromkeys(f"{e.name} {e.version or '(unchecked)'}" for e in engines))
    errors = [f for f in findings if f.severity == "error"]
    for finding in findings:
        say(str(finding), err=finding.severity == "error")
    for item in sorted(unchecked):
        say(f"not checked (no manifest for its program): {item}")
    verdict = "FAILED" if errors else "ok"
    say(
        f"{verdict}: {checked} commands ({1 if space.has_baseline else 0} baseline + {sample} "
        f"sampled configs x {len(targets)} deployment(s): {', '.join(targets)}) checked "
        f"against {against}" + f": {len(errors)} error(s), {len(findings) - len(errors)} warning(s)"
    )
    if errors:
        raise typer.Exit(1)


@friendly
def space_render(
    path: Path | None = typer.Argument(
        None, help="A search-space YAML file (default: the study's space)."
    ),
    study: str = StudyOpt,
    storage: str | None = StorageOpt,
    deployment: Path | None = typer.Option(
        None, "--deployment", help="Deployment to render on (default: the study's)."
    ),
    config: str | None = typer.Option(
        None,
        "--config",
        help='Parameter values as JSON ({"param": value, ...}), over the baseline\'s.',
    ),
    trial: int | None = typer.Option(None, "--trial", help="A stored trial's configuration."),
    sample: int | None = typer.Option(None, "--sample", min=1, help="Sampled configurations."),
    seed: int = typer.Option(0, "--seed", help="Seed of --sample."),
    as_json: bool = typer.Option(False, "--json", help="JSON instead of command lines."),
) -> None:
    """Print the command line and environment of every service for the baseline (default),
    a configuration (--config, --trial) or sampled ones (--sample N --seed S); launches
    nothing."""
    from autotune.deployment import load_deployment
    from autotune.dryrun import render_configs, sample_configs
    from autotune.space import load_space

    check_study(study)
    if sum(x is not None for x in (config, trial, sample)) > 1:
        raise ConfigError("give at most one of --config, --trial, --sample", field="--config")
    study_file = Path("studies") / f"{study}.yaml"
    if path is None or deployment is None:
        definition, study_space, study_deployment, run_dir = deployment_context(study, None)
        space = study_space if path is None else load_space(path)
        chosen = study_deployment if deployment is None else load_deployment(deployment)
        if (
            path is not None
            and deployment is None
            and path.resolve() != definition.resolve(definition.space)
        ):
            raise ConfigError(
                f"{path} is not the space of study {study} ({study_file}): give --deployment",
                field="--deployment",
            )
    else:
        space, chosen = load_space(path), load_deployment(deployment)
        run_dir = chosen.default_run_dir(study)
    configs: list[tuple[str, Any]]
    if config is not None:
        configs = [("config", _given_config(space, config))]
    elif trial is not None:
        from autotune.results import TrialResult, own_trials

        opened = open_existing(study, storage)
        numbers = [t.number for t in own_trials(opened)]  # not those a warm start carried
        if trial not in numbers:
            raise ConfigError(
                f"no trial {trial}", field="--trial", allowed=numbers[-20:] or ["(none)"]
            )
        chosen_trial = TrialResult.from_frozen(
            opened.trials[trial], metric_names=opened.metric_names
        )
        if not chosen_trial.config:
            raise AutotuneError(f"trial {trial} has no stored configuration")
        configs = [(f"trial {trial}", space.complete(chosen_trial.config))]
    elif sample is not None:
        configs = [
            (f"sample {i} (seed {seed})", c)
            for i, c in enumerate(sample_configs(space, n=sample, seed=seed))
        ]
    else:
        configs = [("baseline", space.baseline_config())]
    rendered = render_configs(space, chosen, configs, run_dir=run_dir)
    if as_json:
        sys.stdout.write(json.dumps([r.as_json() for r in rendered], indent=2) + "\n")
        return
    for item in rendered:
        say(item.as_text())


def _given_config(space: Any, config: str) -> Any:
    """``--config`` JSON over the baseline's values, completed and checked against the
    space's rules."""
    try:
        values = json.loads(config)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not JSON: {exc}", field="--config") from None
    if not isinstance(values, dict):
        raise ConfigError("must be a JSON object of parameter values", field="--config")
    base = space.baseline_params() if space.has_baseline else {}
    unknown = sorted(set(values) - {p.name for p in space.params})
    if unknown:
        raise ConfigError(
            f"unknown parameter {unknown[0]!r}",
            field="--config",
            allowed=[p.name for p in space.sampled_params],
        )
    full = space.complete({**base, **values})
    hits = space.violations(full)
    if hits:
        raise ConfigError(f"the configuration hits forbidden rule {hits[0]}", field="--config")
    return full
