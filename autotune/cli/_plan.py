"""``autotune plan``: from one deployment to a fleet: replicas, GPUs, cost and energy of the
winner, the minimal winner, the baseline and the best distinct configurations for a target
request rate.

The plan's modules are imported inside the command (Optuna, SQLAlchemy), which ``autotune
--help`` must not pay.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from autotune.cli._common import (
    StorageOpt,
    StudyFileOpt,
    StudyOpt,
    check_study,
    console,
    friendly,
    open_existing,
    say,
    study_file_path,
)


@friendly
def plan(
    study: str = StudyOpt,
    storage: str | None = StorageOpt,
    study_file: Path | None = StudyFileOpt,
    target_rate: float = typer.Option(
        ..., "--target-rate", help="Peak request rate the fleet must serve (req/s)."
    ),
    headroom: str = typer.Option(
        "20%", "--headroom", help="Provisioned beyond the target: 20% or 0.2 (default 20%)."
    ),
    gpu_hour_cost: float | None = typer.Option(
        None, "--gpu-hour-cost", help="Price of one GPU for one hour; without it, no cost columns."
    ),
    per_replica_rate: float | None = typer.Option(
        None,
        "--per-replica-rate",
        help="For a study that measured no capacity (throughput, goodput, energy): the req/s "
        "one replica of the winner sustains under your SLOs.",
    ),
    gpus_per_replica: int | None = typer.Option(
        None,
        "--gpus-per-replica",
        help="GPUs one replica (one deployment) occupies (default: the deployment's gpus:).",
    ),
    top: int = typer.Option(
        5, "--top", help="Plan the best N distinct configurations (the winner first)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
    save: bool = typer.Option(
        True,
        "--save/--no-save",
        help="Store these settings on the study, for `autotune report` to draw the plan.",
    ),
) -> None:
    """Size a fleet for a target request rate: for the winner, the minimal winner (`autotune
    explain`), the baseline and the best distinct configurations, the replicas needed (from
    the per-replica rate's lower 95% bound, with --headroom), GPUs (the deployment's gpus:),
    cost per hour and per million output tokens (--gpu-hour-cost) and J/token where GPU
    telemetry was recorded. Configurations that met the SLOs at no rate measured are listed,
    never planned. The rate comes from a capacity study; a study of another objective needs
    --per-replica-rate."""
    from autotune.plan import PlanSettings, make_plan, parse_headroom, store_settings

    check_study(study)
    settings = PlanSettings.from_options(
        target_rate=target_rate,
        headroom=parse_headroom(headroom),
        gpu_hour_cost=gpu_hour_cost,
        per_replica_rate=per_replica_rate,
        gpus_per_replica=gpus_per_replica,
        top=top,
    )
    opened = open_existing(study, storage)
    gpus = study_gpus(opened, study_file_path(study, study_file))
    fleet = make_plan(opened, settings, gpus=gpus)
    if save:
        store_settings(opened, settings)
    if as_json:
        sys.stdout.write(json.dumps(fleet.model_dump(mode="json"), indent=2) + "\n")
        return
    print_plan(fleet)


def study_gpus(opened: Any, study_file: Path) -> dict[str, tuple[int, str]]:
    """GPUs per deployment the trials name: the study file's own deployment first (when the
    file is there), then the deployment files found by name."""
    from autotune.errors import AutotuneError
    from autotune.plan import deployment_gpus
    from autotune.plan.gpus import shown_path
    from autotune.results import load_results

    names = {r.deployment or "" for r in load_results(opened)}
    found = deployment_gpus(names)
    if study_file.is_file():
        from autotune.deployment import load_deployment
        from autotune.study.definition import load_study_definition

        try:
            definition = load_study_definition(study_file)
            path = definition.resolve(definition.deployment)
            deployment = load_deployment(path)
        except AutotuneError:
            return found  # the study file is for running; the plan reads the stored trials
        if deployment.gpus is not None:
            found[deployment.name] = (deployment.gpus, shown_path(path))
    return found


def print_plan(fleet: Any) -> None:
    """The plan as a table, then what was left out and what the figures assume."""
    s = fleet.settings
    say(
        f"fleet plan for {s.target_rate:g} req/s + {100 * s.headroom:g}% headroom = "
        f"{fleet.provisioned_rate:g} req/s provisioned (study {fleet.study})"
    )
    if s.gpu_hour_cost is not None:
        say(
            f"price: {s.gpu_hour_cost:g} per GPU-hour (cost/h: the fleet per hour; cost/M tok: "
            "per million output tokens at the target rate)"
        )
    say(f"per-replica rate: {fleet.rate_source}")
    if fleet.rows:
        console.print(plan_table(fleet))
    if fleet.unplannable:
        table = Table(title="not planned: met the SLOs at no rate measured, or unusable")
        table.add_column("trial", justify="right")
        table.add_column("why")
        for u in fleet.unplannable:
            table.add_row(Text(f"{u.trial}" + (f" ({u.label})" if u.label else "")), Text(u.reason))
        console.print(table)
    if fleet.failed:
        say(
            "did not run (not planned): "
            + ", ".join(f"{name} x{count}" for name, count in fleet.failed.items())
        )
    for note in fleet.notes:
        say(f"note: {note}")


def plan_table(fleet: Any) -> Table:
    """One row per planned configuration; the cost columns only with a price, J/token only
    where a trial recorded it."""
    priced = fleet.priced
    energy = any(r.energy_per_token_j is not None for r in fleet.rows)
    table = Table(title=f"fleet plan of study {fleet.study}")
    table.add_column("configuration", no_wrap=True)
    for head in (
        "trial",
        "levers changed",
        "req/s (mean)",
        "lower 95%",
        "replicas",
        "GPUs/rep",
        "GPUs",
        "req/s/GPU",
    ):
        table.add_column(head, justify="right")
    if priced:
        table.add_column("cost/h", justify="right")
        table.add_column("cost/M tok", justify="right")
    if energy:
        table.add_column("J/tok", justify="right")
    for r in fleet.rows:
        label = r.label + (" (cheapest)" if r.cheapest else "")
        cells: list[Text | str] = [
            Text(label, style="bold" if r.cheapest else ""),
            str(r.trial),
            _opt(r.changes),
            f"{r.rate_mean:,.2f}" + (" (at least)" if r.at_limit else ""),
            f"{r.rate_lower:,.2f}",
            str(r.replicas),
            _opt(r.gpus_per_replica),
            _opt(r.gpus),
            _opt(r.rate_per_gpu, "{:,.3f}"),
        ]
        if priced:
            cells += [_opt(r.cost_per_hour, "{:,.2f}"), _opt(r.cost_per_million_tokens, "{:,.3f}")]
        if energy:
            cells.append(_opt(r.energy_per_token_j, "{:.3f}"))
        table.add_row(*cells)
    return table


def _opt(value: float | int | None, fmt: str = "{}") -> str:
    return "n/a" if value is None else fmt.format(value)
