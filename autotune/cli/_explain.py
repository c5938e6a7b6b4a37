"""``autotune explain``: what each of the winner's changes bought, and the minimal winner.

The study modules are imported inside the command (Optuna, SQLAlchemy), which ``autotune
--help`` must not pay.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    shown,
    storage_url,
    study_file_path,
)
from autotune.errors import AutotuneError, ConfigError


@friendly
def explain(
    study: str = StudyOpt,
    storage: str | None = StorageOpt,
    study_file: Path | None = StudyFileOpt,
    repeats: int | None = typer.Option(
        None,
        "--repeats",
        min=1,
        max=20,
        help="Runs per configuration (default: the study file's explain.repeats, else 3).",
    ),
    max_repeats: int | None = typer.Option(
        None, "--max-repeats", min=1, max=50, help="Runs a close elimination step may take."
    ),
    tolerance: float | None = typer.Option(
        None,
        "--tolerance",
        min=0.0001,
        max=0.4999,
        help="The minimal winner may be this fraction below the winner (default 0.03).",
    ),
    path: bool | None = typer.Option(
        None, "--path/--no-path", help="Measure the path from the baseline to the winner."
    ),
    minimal: bool | None = typer.Option(
        None, "--minimal/--no-minimal", help="Search the minimal winner."
    ),
    drop_together: bool | None = typer.Option(
        None,
        "--drop-together/--one-at-a-time",
        help="Begin the minimal search by dropping every negligible change at once "
        "(default), or drop one change at a time.",
    ),
    budget: int | None = typer.Option(
        None,
        "--budget",
        min=0,
        help="At most this many restarts (default: what it needs); 0 measures nothing and "
        "writes the explanation of the runs stored (one a lost machine cut short).",
    ),
    runs_from: str | None = typer.Option(
        None,
        "--runs-from",
        help="Borrow first the fresh-start measurements of this study (a check study of the "
        "same space, deployment and load): configurations it measured enough are not "
        "measured again. Stored: borrowing again adds only what is new.",
    ),
    runs_from_storage: str | None = typer.Option(
        None,
        "--runs-from-storage",
        help="Storage URL of --runs-from (default sqlite:///studies/THAT.db).",
    ),
    runs_from_file: Path | None = typer.Option(
        None,
        "--runs-from-file",
        help="Study definition of --runs-from (default studies/THAT.yaml).",
    ),
    own_runs: bool | None = typer.Option(
        None,
        "--own-runs/--no-own-runs",
        help="Borrow the study's own fresh-start runs of the configurations explained, never "
        "the winner's, at most repeats - 1 of each (a configuration that lost leans low; "
        "default: the study file's explain.own_runs, else off).",
    ),
    show: bool = typer.Option(
        False, "--show", help="Print the stored explanation; measure nothing."
    ),
    quiet: bool = typer.Option(False, "--quiet", help="No progress output."),
) -> None:
    """Explain the winner: revert each change to the baseline (one at a time, from freshly
    started services, with repeats) and report what each bought with a 95% interval; then
    the path from the baseline adding changes largest first, and the minimal winner: the
    fewest changes whose lower bound stays within the tolerance of the winner's (`best
    --minimal` exports it). Stopped, the same command resumes; settings come from the study
    file's explain: section, overridden by these options."""
    from pydantic import ValidationError

    from autotune.explain import ExplainSettings, load_explanation, load_runs
    from autotune.study.definition import load_study_definition
    from autotune.study.explainer import RunSource
    from autotune.study.progress import make_progress
    from autotune.study.runner import Tuner

    check_study(study)
    if show:
        opened = open_existing(study, storage)
        found = load_explanation(opened)
        if found is None:
            raise AutotuneError(
                f"study {study!r} has no explanation yet: run `autotune explain --study {study}`"
            )
        print_explanation(found, runs=load_runs(opened))
        return
    definition = load_study_definition(study_file_path(study, study_file))
    given = {
        k: v
        for k, v in {
            "repeats": repeats,
            "max_repeats": max_repeats,
            "tolerance": tolerance,
            "path": path,
            "minimal": minimal,
            "drop_together": drop_together,
            "budget": budget,
            "own_runs": own_runs,
        }.items()
        if v is not None
    }
    merged = {**definition.explain.model_dump(exclude_unset=True), **given}
    if repeats is not None and "max_repeats" not in merged:
        merged["max_repeats"] = max(repeats, ExplainSettings.model_fields["max_repeats"].default)
    try:
        settings = ExplainSettings.model_validate(merged)
    except ValidationError as exc:
        from autotune.yamlio import validation_error_to_config_error

        err = validation_error_to_config_error(exc, file=None, model=ExplainSettings)
        raise ConfigError(err.message, field="--max-repeats") from None
    open_existing(study, storage)  # the study must exist: explain never creates one
    url = storage_url(study, storage)
    sources = []
    if runs_from is not None:
        check_study(runs_from)
        sources.append(
            RunSource(
                study=open_existing(runs_from, runs_from_storage),
                definition=load_study_definition(study_file_path(runs_from, runs_from_file)),
            )
        )
    elif runs_from_storage is not None or runs_from_file is not None:
        raise ConfigError(
            "--runs-from-storage and --runs-from-file say where the study named by --runs-from "
            "is: give --runs-from STUDY",
            field="--runs-from",
        )
    progress = make_progress(quiet=quiet)
    try:
        tuner = Tuner(definition=definition, study_name=study, storage_url=url, progress=progress)
        progress.message(f"study {study!r} on {shown(url)}")
        result, summary = tuner.explain(settings, sources)
    finally:
        progress.close()
    if summary.interrupted:
        say(
            f"interrupted after {summary.explained} runs this time; the study holds every run "
            f"and decision taken. Resume with the same command: autotune explain --study {study}",
            err=True,
        )
        raise typer.Exit(code=130)
    assert result is not None
    print_explanation(result, runs=load_runs(open_existing(study, storage)))
    say(
        f"done: {summary.explained} runs in {summary.seconds:.0f}s. Next: autotune best "
        f"--study {study} --minimal, autotune report --study {study}"
    )


def _interval(x: Any, fmt: str = "{:+,.1f}") -> str:
    if x is None:
        return "-"
    text = fmt.format(x.value)
    if x.low is not None and x.high is not None:
        text += f" [{fmt.format(x.low)}, {fmt.format(x.high)}]"
    return text


def _mean(m: Any) -> str:
    if m.failure is not None and m.n == 0:
        return f"failed: {m.failure}"
    if m.mean is None:
        return "not measured"
    half = "" if m.mean.high is None else f" +- {m.mean.high - m.mean.value:,.1f}"
    slo = f", {m.infeasible} broke an SLO" if m.infeasible else ""
    return f"{m.mean.value:,.1f}{half} (n={m.n}{slo})"


def _energy(m: Any, runs: Mapping[str, Sequence[Any]]) -> str:
    """A configuration's GPU figures over its runs that measured them: mean J/token and
    mean power (``""`` when none did)."""
    tele = [r.telemetry for r in runs.get(m.key or "", ()) if r.telemetry is not None]
    per_token = [t.energy_per_token_j for t in tele if t.energy_per_token_j is not None]
    power = [t.power_mean_w for t in tele if t.power_mean_w is not None]
    parts = []
    if per_token:
        parts.append(f"{sum(per_token) / len(per_token):.4g} J/token")
    if power:
        parts.append(f"{sum(power) / len(power):,.0f} W")
    return ", ".join(parts)


def print_explanation(e: Any, runs: Mapping[str, Sequence[Any]] | None = None) -> None:
    """The explanation as three tables: effects, path, minimal winner. ``runs`` (the
    stored runs by configuration key): where their GPUs were measured, each
    configuration's J/token and power beside its figures."""
    from autotune.explain.blocks import gpu_blocked
    from autotune.explain.occasions import describe

    unit = e.unit
    runs = runs or {}
    blocks = gpu_blocked(e, runs)
    gpu = any(r.telemetry is not None and r.telemetry.available for rs in runs.values() for r in rs)
    noise = "" if e.noise_sd is None else f"; run-to-run noise {100 * e.noise_sd:.1f}%"
    energy = (
        f"; GPU: winner {_energy(e.winner_measured, runs) or 'n/a'}, baseline "
        f"{_energy(e.baseline_measured, runs) or 'n/a'}"
        if gpu
        else ""
    )
    console.print(
        Text(
            f"trial #{e.winner}: {_mean(e.winner_measured)} {unit}; baseline "
            f"{_mean(e.baseline_measured)} {unit}{noise}; {e.runs} runs"
            + (f" + {e.borrowed} borrowed" if e.borrowed else "")
            + (f" ({e.borrowed_own} from its own trials)" if e.borrowed_own else "")
            + energy
            + ("" if e.complete else f" (incomplete: {e.stopped or 'not finished'})")
        )
    )
    for o in e.occasions:
        console.print(Text(describe(o), style="bold yellow" if o.drift else ""))
    if blocks is not None:
        console.print(Text(blocks.describe()))
    table = Table(title=f"what each change bought ({unit}, 95% interval)")
    columns = ["change", "baseline -> winner", "winner without it", "contribution", "share"]
    columns += ["share, the GPU as a block"] if blocks is not None else []
    for col in columns + (["without it: J/token, GPU power"] if gpu else []):
        table.add_column(col)
    for x in sorted(
        e.effects,
        key=lambda x: -(x.contribution.value if x.contribution else float("inf")),
    ):
        share = "-" if x.relative is None else f"{100 * x.relative:+.1f}%"
        values = ", ".join(
            f"{lever}: {x.baseline.get(lever, '(inactive)')} -> {x.winner.get(lever, '(inactive)')}"
            for lever in x.levers
        )
        label = x.change + (" (required)" if x.required else "")
        if x.note:
            label += f"\n  {x.note}"
        cells: list[Text | str] = [
            Text(label),
            Text(values),
            Text(_mean(x.without)),
            _interval(x.contribution),
            share,
        ]
        if blocks is not None:
            cells.append(blocks.share_text(x.change))
        if gpu:
            cells.append(Text(_energy(x.without, runs) or "-"))
        table.add_row(*cells)
    console.print(table)
    if e.path:
        path = Table(title=f"from the baseline to the winner, largest change first ({unit})")
        for col in ("added", "measured", "step") + (("J/token, GPU power",) if gpu else ()):
            path.add_column(col)
        tail = [Text(_energy(e.baseline_measured, runs) or "-")] if gpu else []
        path.add_row("(baseline)", Text(_mean(e.baseline_measured)), "", *tail)
        for step in e.path:
            label = " + ".join(step.added) + (f"\n  {step.note}" if step.note else "")
            tail = [Text(_energy(step.measured, runs) or "-")] if gpu else []
            path.add_row(Text(label), Text(_mean(step.measured)), _interval(step.step), *tail)
        console.print(path)
    m = e.minimal
    if m is not None:
        ratio = _interval(m.ratio, "{:.3f}")
        console.print(
            Text(
                f"minimal winner: {len(m.kept)} of {len(m.kept) + len(m.dropped)} changes "
                f"({', '.join(m.kept) or 'none'}); {_mean(m.measured)} {unit}, {ratio} of the "
                f"winner; dropped: {', '.join(m.dropped) or 'none'}"
                + ("" if m.complete else " (search not finished)")
            )
        )
        for d in m.decisions:
            console.print(Text(f"  {d.action} {d.change}: {d.why}"))
