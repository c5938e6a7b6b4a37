"""The ``autotune`` command line.

Every command takes ``--study NAME`` and ``--storage URL``; the default storage is
``sqlite:///studies/NAME.db`` and the default study file ``studies/NAME.yaml``. Errors the
user can cause are printed as one line (file, field, allowed values) with exit code 2.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from autotune.errors import AutotuneError
from autotune.secrets import scrub_text

DEFAULT_STUDY = "dsv4-flash-sim"
EXPORT_FORMATS = ("systemd", "env", "command", "json")
MAX_TOKENS = 1 << 20
"""Longest prompt or output ``bench`` builds (prompts are made in memory)."""
_BENCH_OPTIONS = {
    "concurrency": "--concurrency",
    "input_len": "--input-len",
    "output_len": "--output-len",
    "requests": "--requests",
    "duration_s": "--duration",
    "warmup_requests": "--warmup",
    "api": "--api",
    "model": "--model",
    "prompt": "--prompt",
}

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Bayesian configuration search for LLM serving deployments.",
)
space_app = typer.Typer(no_args_is_help=True, help="Search-space files.")
app.add_typer(space_app, name="space")

console = Console()
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])

_WORKER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:-]{0,99}")
StudyOpt = typer.Option(
    DEFAULT_STUDY, "--study", help="Study name (also selects studies/NAME.yaml)."
)
StorageOpt = typer.Option(
    None, "--storage", help="Storage URL (default sqlite:///studies/NAME.db)."
)


def _friendly(func: F) -> F:
    """Turn AutotuneError into a one-line message and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except AutotuneError as exc:
            # Text, not markup: the message quotes what the user wrote ("[/]" included).
            text = _one_line(scrub_text(str(exc)))  # a driver may quote a password
            message = Text.assemble(("error:", "bold red"), " ", text)
            err_console.print(message, highlight=False, markup=False, soft_wrap=True)
            raise typer.Exit(code=2) from None
        except KeyboardInterrupt:
            err_console.print("interrupted", highlight=False, markup=False)
            raise typer.Exit(code=130) from None

    return wrapper  # type: ignore[return-value]


def _one_line(text: str) -> str:
    """Control characters a user typed (a newline in ``--study``) shown escaped."""
    from autotune.yamlio import escape_controls

    return escape_controls(text)


def _check_study(study: str) -> None:
    """``--study`` names files (``studies/NAME.yaml``, the run directory): checked first."""
    from autotune.study.storage import check_study_name

    check_study_name(study)


def _check_out(path: Path, *, option: str, directory: bool) -> None:
    """An output path that cannot be written fails before any work, naming the option."""
    from autotune.errors import ConfigError

    if directory and path.exists() and not path.is_dir():
        raise ConfigError(f"{str(path)!r} exists and is not a directory", field=option)
    if not directory and path.is_dir():
        raise ConfigError(f"{str(path)!r} is a directory; give a file name", field=option)
    if not directory and path.exists() and not (path.is_file() or path.is_char_device()):
        # A FIFO would block the write until someone reads it.
        raise ConfigError(f"{str(path)!r} is not a regular file", field=option)
    above = next((p for p in path.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise ConfigError(f"{str(above)!r} is not a directory", field=option)


@contextlib.contextmanager
def _writing(option: str) -> Iterator[None]:
    """OSError while writing an output -> ConfigError naming the option (disk full, ...)."""
    from autotune.errors import ConfigError

    try:
        yield
    except OSError as exc:
        where = f" {exc.filename!r}" if exc.filename else ""
        raise ConfigError(f"cannot write{where}: {exc.strerror or exc}", field=option) from None


def _shown(url: str) -> str:
    """A storage URL without its password."""
    from autotune.study.storage import display_url

    return display_url(url)


def _storage_url(study: str, storage: str | None) -> str:
    from autotune.study.storage import default_storage_url

    return storage or default_storage_url(study)


def _open_existing(study: str, storage: str | None) -> Any:
    from autotune.study.storage import load_study, open_storage

    url = _storage_url(study, storage)
    return load_study(study, open_storage(url, create=False))


@app.command()
@_friendly
def run(
    trials: int = typer.Option(
        200, "--trials", min=1, help="Run until the study holds this many completed trials."
    ),
    study: str = StudyOpt,
    storage: str | None = StorageOpt,
    study_file: Path | None = typer.Option(
        None, "--study-file", help="Study definition (default studies/NAME.yaml)."
    ),
    sampler: str | None = typer.Option(
        None, "--sampler", help="tpe (default), random, grid, qmc, nsga2."
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
) -> None:
    """Run (or resume) a study: the same command continues where it stopped.

    Started on several machines with the same --storage and --study, the workers share the
    study: no configuration is measured twice, a worker that dies is noticed and its trial
    re-queued. See `autotune status`.
    """
    from autotune.study.definition import SAMPLERS, load_study_definition
    from autotune.study.progress import make_progress
    from autotune.study.runner import Tuner

    _check_study(study)
    if sampler is not None and sampler not in SAMPLERS:
        from autotune.errors import ConfigError

        raise ConfigError(f"unknown sampler {sampler!r}", field="--sampler", allowed=SAMPLERS)
    if worker is not None and not _WORKER_NAME.fullmatch(worker):
        from autotune.errors import ConfigError

        raise ConfigError(
            f"worker name {worker!r} is not allowed",
            field="--worker",
            allowed="1-100 characters: letters, digits, '.', '_', '-', '/', ':'",
        )
    path = study_file or Path("studies") / f"{study}.yaml"
    definition = load_study_definition(path)

    url = _storage_url(study, storage)
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
        )
        who = f" as worker {tuner.worker_name!r}" if worker or tuner.shared else ""
        progress.message(
            f"study {study!r} on {_shown(url)}{who}: {tuner.completed_count()} completed "
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
    console.print(
        f"done: {summary.trials_run} trials{again} run in {summary.seconds:.0f}s; study holds "
        f"{summary.trials_total}. Next: autotune best --study {study}",
        soft_wrap=True,
        highlight=False,
        markup=False,
    )


@app.command()
@_friendly
def best(
    study: str = StudyOpt,
    storage: str | None = StorageOpt,
    export: str | None = typer.Option(None, "--export", help="systemd, env, command or json."),
    out: Path | None = typer.Option(
        None, "--out", help="Output directory for --export (default: print)."
    ),
    study_file: Path | None = typer.Option(
        None,
        "--study-file",
        help="Study file whose deployment supplies secret values for --export systemd "
        "(default: studies/STUDY.yaml when it exists).",
    ),
) -> None:
    """Best feasible configuration (ranked by a lower confidence bound), its metrics, mean +-
    95% CI over its measurements and its gain over the baseline."""
    from autotune.errors import ConfigError
    from autotune.export import export as do_export
    from autotune.export import redact_trial
    from autotune.results import baseline_trial, best_estimate

    _check_study(study)
    if export is not None and export not in EXPORT_FORMATS:
        raise ConfigError(
            f"unknown export format {export!r}", field="--export", allowed=EXPORT_FORMATS
        )
    if out is not None:
        _check_out(out, option="--out", directory=True)
    opened = _open_existing(study, storage)
    estimate = best_estimate(opened)
    if estimate is None:
        raise AutotuneError(f"study {study!r} has no feasible completed trial yet")
    winner = estimate.trial
    base = baseline_trial(opened)
    if export is None:
        gain = None
        if base is not None and base.feasible and base.throughput:
            gain = estimate.mean / base.throughput
        _print_best(redact_trial(winner), base, gain, estimate)
        return
    if export == "systemd" and out is None:
        raise ConfigError("--export systemd writes files: give --out DIR", field="--out")
    current = None
    if export == "systemd" and (study_file or (Path("studies") / f"{study}.yaml")).is_file():
        # The deployment as it is now holds the secrets the study never stored.
        from autotune.render import render

        _, space, deployment, run_dir = _deployment_context(study, study_file)
        current = render(space, deployment, space.complete(winner.config), run_dir=run_dir)
    with _writing("--out"):
        written = do_export(
            winner,
            fmt=export,  # type: ignore[arg-type]
            out_dir=out,
            current=current,
        )
    if isinstance(written, str):
        sys.stdout.write(written if written.endswith("\n") else written + "\n")
    else:
        for path in written:
            console.print(str(path), highlight=False, markup=False)


def _print_best(winner: Any, base: Any, gain: float | None, estimate: Any) -> None:
    from rich.table import Table

    from autotune.results import format_estimate

    m = winner.metrics or {}
    table = Table(title=f"best feasible trial #{winner.number}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("output throughput", format_estimate(estimate))
    if estimate.half_width is not None:
        table.add_row(
            "conservative estimate",
            f"{estimate.lower:,.1f} tok/s (lower 95% bound, what configurations are ranked by)",
        )
        table.add_row(
            "run-to-run noise",
            f"{100 * (estimate.noise_sd or 0):.1f}% (pooled over the repeated measurements, "
            f"{estimate.noise_df} df)",
        )
    runs = []
    for x in estimate.measurements:
        label = f"trial #{x.of}" if x.repeat == 0 else f"re-run {x.repeat}"
        if x.full and x.throughput is not None:
            runs.append(f"{label}: {x.throughput:,.1f}")
        elif x.aborted:
            runs.append(f"{label}: aborted early")
        else:
            runs.append(f"{label}: {x.failure or 'infeasible'}")
    table.add_row("measurements (tok/s)", Text("; ".join(runs)))
    if base is not None and base.metrics:
        table.add_row(
            f"baseline (trial #{base.number})",
            f"{base.metrics.get('output_throughput', 0):,.1f} tok/s",
        )
    if gain is not None:
        table.add_row("gain over baseline", f"{gain:,.1f}x")
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        if name in m:
            d = m[name]
            table.add_row(
                name.replace("_ms", "") + " (ms)",
                f"mean {d['mean']:.1f}  p50 {d['p50']:.1f}  p90 {d['p90']:.1f}  p99 {d['p99']:.1f}",
            )
    if "error_rate" in m:
        table.add_row("error rate", f"{m['error_rate']:.3f}")
    table.add_row("config", Text(json.dumps(winner.config, sort_keys=True)))
    for name, svc in (winner.services or {}).items():
        table.add_row(Text(f"{name} command"), Text(svc.command))
    if winner.overrides:
        table.add_row("server overrides", Text("\n".join(winner.overrides)))
    console.print(table)


@app.command()
@_friendly
def report(
    study: str = StudyOpt,
    storage: str | None = StorageOpt,
    out: Path | None = typer.Option(None, "--out", help="HTML file (default reports/NAME.html)."),
) -> None:
    """Write one self-contained HTML report (Pareto front, history, importances, top 10)."""
    from autotune.report import write_report

    _check_study(study)
    target = out or Path("reports") / f"{study}.html"
    _check_out(target, option="--out", directory=False)
    opened = _open_existing(study, storage)
    with _writing("--out"):
        path = write_report(opened, path=target)
    console.print(f"report written: {path}", highlight=False, markup=False)


@app.command()
@_friendly
def status(
    study: str = StudyOpt,
    storage: str | None = StorageOpt,
    as_json: bool = typer.Option(False, "--json", help="Print the status as JSON."),
) -> None:
    """Workers of the study (running, lost, stopped) and what each is doing, running trials,
    trial counts (reused, infeasible, aborted, duplicate configurations) and the best so far."""
    from autotune.study.status import render_status, status_json, study_status
    from autotune.study.storage import storage_errors

    _check_study(study)
    opened = _open_existing(study, storage)
    with storage_errors(_storage_url(study, storage), f"reading study {study!r}"):
        current = study_status(opened)
    if as_json:
        sys.stdout.write(json.dumps(status_json(current), indent=2) + "\n")
        return
    # Every string a user or worker wrote (study, worker, host, phase) is a rich Text in
    # the renderable, never markup: a "[/]" in a worker name prints as it is.
    console.print(render_status(current))


@app.command()
@_friendly
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
        err_console.print(_one_line(line), highlight=False, markup=False, soft_wrap=True)

    try:
        report = migrate_study(
            source_url=from_url,
            target_url=to_url,
            study_name=study,
            progress=None if quiet else progress,
        )
    except KeyboardInterrupt:
        err_console.print(
            "interrupted: nothing was kept in the target; the source is unchanged",
            highlight=False,
            markup=False,
        )
        raise typer.Exit(code=130) from None
    counts = ", ".join(f"{n} {s.lower()}" for s, n in report.trials.items()) or "none"
    console.print(
        _one_line(
            f"migrated study {report.study_name!r} from {report.source} to {report.target}: "
            f"{report.total_trials} trials ({counts}), {report.study_user_attrs} user and "
            f"{report.study_system_attrs} system study attributes, in {report.seconds:.1f}s; "
            "verified field by field. The source is unchanged. Next: run the workers with "
            f"--study {report.study_name} --storage <the --to URL>"
        ),
        soft_wrap=True,
        highlight=False,
        markup=False,
    )


@app.command()
@_friendly
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

    _check_study(study)
    _open_existing(study, storage)
    url = _storage_url(study, storage)
    console.print(
        f"optuna-dashboard on http://{host}:{port} for {_shown(url)} (Ctrl-C to stop)",
        highlight=False,
        markup=False,
    )
    serve_dashboard(url, host=host, port=port)


def _deployment_context(study: str, study_file: Path | None) -> tuple[Any, Any, Any, Path]:
    """(definition, space, deployment, run_dir) of a study file, as ``run`` resolves them."""
    from autotune.deployment import load_deployment
    from autotune.space import load_space
    from autotune.study.definition import load_study_definition

    definition = load_study_definition(study_file or Path("studies") / f"{study}.yaml")
    space = load_space(definition.resolve(definition.space))
    deployment = load_deployment(definition.resolve(definition.deployment))
    return definition, space, deployment, deployment.default_run_dir(study)


@app.command()
@_friendly
def restore(
    study: str = StudyOpt,
    study_file: Path | None = typer.Option(None, "--study-file"),
) -> None:
    """Leave the hosts as found: remove autotune's drop-ins, stop what it started."""
    from autotune.launch.factory import make_launcher
    from autotune.render import render

    _check_study(study)
    _, space, deployment, run_dir = _deployment_context(study, study_file)
    specs = render(space, deployment, space.baseline_config(), run_dir=run_dir)
    launcher = make_launcher(deployment, run_dir=run_dir)
    try:
        done = launcher.restore(
            specs, on_event=lambda s, e: console.print(f"{s}: {e}", highlight=False, markup=False)
        )
    finally:
        launcher.detach()
    console.print(f"restored: {', '.join(done) or 'nothing to do'}", highlight=False, markup=False)


@app.command()
@_friendly
def apply(
    trial: int | None = typer.Option(None, "--trial", help="Trial number to install."),
    best_: bool = typer.Option(False, "--best", help="Install the best feasible trial."),
    study: str = StudyOpt,
    storage: str | None = StorageOpt,
    study_file: Path | None = typer.Option(None, "--study-file"),
) -> None:
    """Install a trial's configuration for good (services keep running after autotune exits)."""
    from autotune.errors import ConfigError
    from autotune.launch.factory import make_launcher
    from autotune.render import render
    from autotune.results import TrialResult, best_trial

    _check_study(study)
    if (trial is None) == (not best_):
        raise ConfigError("give exactly one of --trial N or --best", field="apply")
    opened = _open_existing(study, storage)
    if best_:
        chosen = best_trial(opened)
        if chosen is None:
            raise AutotuneError(f"study {study!r} has no feasible completed trial yet")
    else:
        numbers = [t.number for t in opened.trials]
        if trial not in numbers:
            raise ConfigError(
                f"no trial {trial}", field="--trial", allowed=numbers[-20:] or ["(none)"]
            )
        chosen = TrialResult.from_frozen(opened.trials[trial], metric_names=opened.metric_names)
    if not chosen.config:
        raise AutotuneError(f"trial {chosen.number} has no stored configuration")
    _, space, deployment, run_dir = _deployment_context(study, study_file)
    specs = render(space, deployment, space.complete(chosen.config), run_dir=run_dir)
    launcher = make_launcher(deployment, run_dir=run_dir)
    try:
        result = launcher.apply(
            specs, on_event=lambda s, e: console.print(f"{s}: {e}", highlight=False, markup=False)
        )
    except BaseException:
        launcher.close()
        raise
    launcher.detach()
    console.print(
        f"trial {chosen.number} installed ({', '.join(result.restarted) or 'nothing restarted'}); "
        f"endpoint {deployment.endpoint_url(specs)}; undo with `autotune restore --study {study}`",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )


@app.command()
@_friendly
def bench(
    url: str = typer.Option(..., "--url", help="Base URL of an OpenAI-compatible server."),
    concurrency: int = typer.Option(16, "--concurrency", min=1, max=65536),
    input_len: int = typer.Option(256, "--input-len", min=1, max=MAX_TOKENS),
    output_len: int = typer.Option(32, "--output-len", min=1, max=MAX_TOKENS),
    requests: int | None = typer.Option(
        None, "--requests", min=1, help="Measured requests (default 4 x C)."
    ),
    duration: float | None = typer.Option(
        None, "--duration", help="Measure for this many seconds instead."
    ),
    warmup: int | None = typer.Option(
        None, "--warmup", min=0, help="Warm-up requests (default C)."
    ),
    api: str = typer.Option("completions", "--api", help="completions or chat."),
    model: str | None = typer.Option(None, "--model"),
    prompt: str | None = typer.Option(
        None,
        "--prompt",
        help="token_ids or text (default: token_ids for completions, text for chat).",
    ),
    ignore_eos: bool = typer.Option(
        True,
        "--ignore-eos/--no-ignore-eos",
        help="Send ignore_eos (SGLang, vLLM); --no-ignore-eos leaves the field out for "
        "servers that refuse unknown fields (transformers serve: HTTP 422).",
    ),
    require_done: bool = typer.Option(
        True,
        "--require-done/--no-require-done",
        help="A stream must end with 'data: [DONE]'; --no-require-done also accepts a "
        "clean end after a chunk with a finish_reason (transformers serve).",
    ),
    records: Path | None = typer.Option(
        None, "--records", help="Write raw per-request records (JSON lines)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print metrics as JSON."),
) -> None:
    """Run the load generator alone against a server."""
    from pydantic import ValidationError

    from autotune.errors import ConfigError
    from autotune.loadgen import LoadSpec, run_load
    from autotune.loadgen.display import metrics_table
    from autotune.yamlio import validation_error_to_config_error

    _check_url(url)
    if api not in ("completions", "chat"):
        raise ConfigError(f"unknown api {api!r}", field="--api", allowed=("completions", "chat"))
    if duration is not None and not (math.isfinite(duration) and duration > 0):
        raise ConfigError(
            f"must be a positive number of seconds, got {duration}", field="--duration"
        )
    if records is not None:
        _check_out(records, option="--records", directory=False)
    try:
        spec = LoadSpec(
            concurrency=concurrency,
            input_len=input_len,
            output_len=output_len,
            warmup_requests=concurrency if warmup is None else warmup,
            requests=None if duration is not None else (requests or 4 * concurrency),
            duration_s=duration,
            # The measure phase's hard cap: in-flight requests get a request timeout's time.
            max_duration_s=max(120.0, duration + 60.0) if duration is not None else 120.0,
            api=api,  # type: ignore[arg-type]
            prompt=prompt,  # type: ignore[arg-type]
            ignore_eos=True if ignore_eos else None,
            require_done=require_done,
            model=model,
        )
    except ValidationError as exc:
        err = validation_error_to_config_error(exc, file=None, model=LoadSpec)
        option = _BENCH_OPTIONS.get(err.field or "", err.field)
        raise ConfigError(err.message, field=option, allowed=err.allowed) from None
    result = run_load(url, spec, on_phase=lambda p: err_console.print(Text(p, style="dim")))
    if records is not None:
        with _writing("--records"), records.open("w") as fh:
            for r in result.records:
                fh.write(
                    json.dumps(
                        r.model_dump(mode="json") if hasattr(r, "model_dump") else r.__dict__
                    )
                    + "\n"
                )
    if as_json:
        sys.stdout.write(json.dumps(result.metrics.model_dump(mode="json"), indent=2) + "\n")
    else:
        console.print(metrics_table(result.metrics))


def _check_url(url: str) -> None:
    """``--url`` must be http(s)://HOST[:PORT][/path] (urllib and httpx raise raw errors)."""
    from urllib.parse import urlsplit

    from autotune.errors import ConfigError

    allowed = ["http://HOST:PORT", "https://HOST:PORT"]
    try:
        parts = urlsplit(url.strip())
        port = parts.port  # ValueError for a port that is not 0..65535
    except ValueError as exc:
        raise ConfigError(f"invalid URL {url!r}: {exc}", field="--url", allowed=allowed) from None
    bad = any(c.isspace() or ord(c) < 32 or c == "\x7f" for c in url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or bad or port == 0:
        raise ConfigError(f"not an http(s) URL: {url!r}", field="--url", allowed=allowed)


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
            found.setdefault(shown(file), load_deployment(file))
    for file in sorted(Path("launchers").glob("*.yaml")):
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
            found.setdefault(shown(file), candidate)
    return found


@space_app.command("check")
@_friendly
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
    console.print(str(summarize(space)), highlight=False, markup=False, soft_wrap=True)
    targets = _space_deployments(path, space, deployment)
    if not targets:
        console.print(
            "no deployment given and no study under studies/ uses this space: only the "
            "space's own flags were checked (give --deployment FILE)",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        return
    findings, checked, unchecked = check_commands(space, targets, samples=sample, seed=seed)
    engines = [
        get_engine(space.engine_ref(s).name, space.engine_ref(s).version) for s in space.services
    ]
    against = ", ".join(dict.fromkeys(f"{e.name} {e.version or '(unchecked)'}" for e in engines))
    errors = [f for f in findings if f.severity == "error"]
    for finding in findings:
        (err_console if finding.severity == "error" else console).print(
            str(finding), highlight=False, markup=False, soft_wrap=True
        )
    for item in sorted(unchecked):
        console.print(
            f"not checked (no manifest for its program): {item}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    verdict = "FAILED" if errors else "ok"
    console.print(
        f"{verdict}: {checked} commands ({1 if space.has_baseline else 0} baseline + {sample} "
        f"sampled configs x {len(targets)} deployment(s): {', '.join(targets)}) checked "
        f"against {against}"
        + f": {len(errors)} error(s), {len(findings) - len(errors)} warning(s)",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    if errors:
        raise typer.Exit(1)


@space_app.command("render")
@_friendly
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
    from autotune.errors import ConfigError
    from autotune.space import load_space

    _check_study(study)
    if sum(x is not None for x in (config, trial, sample)) > 1:
        raise ConfigError("give at most one of --config, --trial, --sample", field="--config")
    study_file = Path("studies") / f"{study}.yaml"
    if path is None or deployment is None:
        definition, study_space, study_deployment, run_dir = _deployment_context(study, None)
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
        configs = [("config", full)]
    elif trial is not None:
        from autotune.results import TrialResult

        opened = _open_existing(study, storage)
        numbers = [t.number for t in opened.trials]
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
        console.print(item.as_text(), highlight=False, markup=False, soft_wrap=True)


def _quiet_libraries() -> None:
    """Optuna's INFO logs and experimental-API warnings are noise in a CLI."""
    import logging
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", category=FutureWarning, module="optuna")
    logging.getLogger("httpx").setLevel(logging.WARNING)


def main() -> None:
    _quiet_libraries()
    app()


if __name__ == "__main__":
    main()
