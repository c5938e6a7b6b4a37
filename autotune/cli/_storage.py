"""Where a study is kept: ``migrate`` (to another storage) and ``dashboard`` (Optuna's web UI
on it).

The migration and dashboard modules are imported inside the commands: they load SQLAlchemy,
Optuna and optuna-dashboard (~150 ms), which ``autotune --help`` must not pay.
"""

from __future__ import annotations

import typer

from autotune.cli._common import (
    StorageOpt,
    StudyOpt,
    check_study,
    friendly,
    one_line,
    open_existing,
    say,
    shown,
    storage_url,
)


@friendly
def migrate(
    from_url: str = typer.Option(
        ..., "--from", help="Source storage URL, e.g. sqlite:///studies/NAME.db (only read)."
    ),
    to_url: str = typer.Option(
        ...,
        "--to",
        help="Target storage URL, e.g. postgresql+psycopg2://USER@HOST/DB (the database "
        "must exist; a new SQLite file is created).",
    ),
    study: str | None = typer.Option(
        None, "--study", help="Study to move (default: the only study in the source)."
    ),
    quiet: bool = typer.Option(False, "--quiet", help="No progress output."),
) -> None:
    """Move a study to another storage (e.g. SQLite to PostgreSQL for several workers): all
    trials, waiting retries, re-measurements and worker records, verified field by field;
    refused while the source has RUNNING trials or the target holds the study. The source is
    left as it was."""
    from autotune.study.migrate import migrate_study

    def progress(line: str) -> None:
        say(one_line(line), err=True)

    try:
        report = migrate_study(
            source_url=from_url,
            target_url=to_url,
            study_name=study,
            progress=None if quiet else progress,
        )
    except KeyboardInterrupt:
        say("interrupted: nothing was kept in the target; the source is unchanged", err=True)
        raise typer.Exit(code=130) from None
    counts = ", ".join(f"{n} {s.lower()}" for s, n in report.trials.items()) or "none"
    versions = ", ".join(
        f"{n} {'unreadable' if v == 'unreadable' else f'v{v}'}"
        for v, n in report.schema_versions.items()
    )
    say(
        one_line(
            f"migrated study {report.study_name!r} from {report.source} to {report.target}: "
            f"{report.total_trials} trials ({counts}) with trial records {versions or 'none'}, "
            f"{report.study_user_attrs} user and "
            f"{report.study_system_attrs} system study attributes, in {report.seconds:.1f}s; "
            "verified field by field. The source is unchanged. Next: run the workers with "
            f"--study {report.study_name} --storage <the --to URL>"
        )
    )


@friendly
def dashboard(
    study: str = StudyOpt,
    storage: str | None = StorageOpt,
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Bind address (loopback unless told otherwise)."
    ),
    port: int = typer.Option(8080, "--port", min=1, max=65535),
) -> None:
    """Serve optuna-dashboard on the study's storage."""
    from autotune.dashboard import serve_dashboard

    check_study(study)
    open_existing(study, storage)
    url = storage_url(study, storage)
    say(f"optuna-dashboard on http://{host}:{port} for {shown(url)} (Ctrl-C to stop)")
    serve_dashboard(url, host=host, port=port)
