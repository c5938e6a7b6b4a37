"""What a study found: ``best`` (the winner, exported), ``report`` (HTML) and ``status``
(workers and trial counts).

The results, export, report and status modules are imported inside the commands: they load
Optuna, SQLAlchemy and plotly (60-200 ms each), which ``autotune --help`` must not pay.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table
from rich.text import Text

from autotune.cli._common import (
    StorageOpt,
    StudyOpt,
    check_out,
    check_study,
    console,
    deployment_context,
    friendly,
    open_existing,
    say,
    storage_url,
    study_file_path,
    writing,
)
from autotune.errors import AutotuneError, ConfigError

if TYPE_CHECKING:  # annotations only: `autotune --help` loads neither
    from autotune.study.environment import EnvironmentCheck
    from autotune.trial.record import ServiceRecord

EXPORT_FORMATS = ("systemd", "env", "command", "json", "compose", "k8s")
CONTAINER_FORMATS = ("compose", "k8s")


@friendly
def best(
    study: str = StudyOpt,
    storage: str | None = StorageOpt,
    export: str | None = typer.Option(
        None, "--export", help="systemd, env, command, json, compose or k8s."
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Output directory for --export (default: print)."
    ),
    study_file: Path | None = typer.Option(
        None,
        "--study-file",
        help="Study file whose deployment supplies secret values for --export systemd "
        "(default: studies/STUDY.yaml when it exists).",
    ),
    minimal: bool = typer.Option(
        False,
        "--minimal",
        help="The minimal winner instead (the fewest changes within the tolerance of the "
        "winner, found by `autotune explain`); every --export ships it.",
    ),
    image: list[str] | None = typer.Option(
        None,
        "--image",
        help="Container image for --export compose/k8s: IMAGE for every service or "
        "SERVICE=IMAGE (repeatable). Default: vllm/vllm-openai:vVERSION for vLLM, "
        "lmsysorg/sglang:vVERSION for SGLang and its router; none for the simulated, "
        "transformers serve and generic servers.",
    ),
) -> None:
    """Best feasible configuration (ranked by a lower confidence bound), its metrics, mean +-
    95% CI over its measurements and its gain over the baseline; with --minimal, the
    smallest set of its changes measured within the tolerance of it."""
    from autotune.export import export as do_export
    from autotune.export import redact_trial
    from autotune.results import baseline_trial, config_estimates, study_cards, winner_candidates

    check_study(study)
    if export is not None and export not in EXPORT_FORMATS:
        raise ConfigError(
            f"unknown export format {export!r}", field="--export", allowed=EXPORT_FORMATS
        )
    if image and export not in CONTAINER_FORMATS:
        raise ConfigError(
            "--image is for --export compose or k8s"
            + (f", not {export}" if export is not None else ""),
            field="--image",
            allowed=CONTAINER_FORMATS,
        )
    if out is not None:
        check_out(out, option="--out", directory=True)
    opened = open_existing(study, storage)
    estimates = config_estimates(opened)  # read once: the winner and the study's GPUs
    ranked = winner_candidates(opened, estimates)
    estimate = ranked[0] if ranked else None  # best_estimate's pick
    if estimate is None:
        raise AutotuneError(f"study {study!r} has no feasible completed trial yet")
    winner = estimate.trial
    base = baseline_trial(opened)
    if minimal:
        winner = _minimal(opened, winner, show=export is None, base=base)
        if export is None:
            return
    if export is None:
        gain = None
        if base is not None and base.feasible and base.throughput:
            gain = estimate.mean / base.throughput
        cards = study_cards(opened, estimates)
        _print_best(redact_trial(winner), base, gain, estimate, cards=cards)
        return
    if export == "systemd" and out is None:
        raise ConfigError("--export systemd writes files: give --out DIR", field="--out")
    current = None
    if export == "systemd" and study_file_path(study, study_file).is_file():
        # The deployment as it is now holds the secrets the study never stored.
        from autotune.render import render

        _, space, deployment, run_dir = deployment_context(study, study_file)
        current = render(
            space, deployment, space.complete(winner.params or winner.config), run_dir=run_dir
        )
    with writing("--out"):
        written = do_export(
            winner,
            fmt=export,  # type: ignore[arg-type]
            out_dir=out,
            current=current,
            study=study,
            images=image or (),
        )
    if isinstance(written, str):
        sys.stdout.write(written if written.endswith("\n") else written + "\n")
    else:
        for path in written:  # one path a line, never wrapped: scripts read these
            say(str(path))


def _minimal(opened: Any, winner: Any, *, show: bool, base: Any) -> Any:
    """The stored explanation's minimal winner as a trial (printed when ``show``)."""
    from autotune.explain import load_explanation, load_runs
    from autotune.explain.minimal import minimal_trial
    from autotune.export import redact_trial

    explanation = load_explanation(opened)
    if explanation is None:
        raise AutotuneError(
            f"study {opened.study_name!r} has no explanation yet: run `autotune explain "
            f"--study {opened.study_name}` first"
        )
    trial = minimal_trial(explanation, load_runs(opened), winner)
    m = explanation.minimal
    assert m is not None
    if not m.complete:
        say(
            "note: the minimal-winner search did not finish (resume it with `autotune "
            "explain`): this is the smallest set found so far",
            err=True,
        )
    if not show:
        return trial
    unit = explanation.unit
    table = Table(title=f"minimal winner of trial #{winner.number}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("changes kept", Text(", ".join(m.kept) or "none (the baseline)"))
    table.add_row("changes dropped", Text(", ".join(m.dropped) or "none: every change is needed"))
    if m.measured.mean is not None:
        half = m.measured.mean.high - m.measured.mean.value if m.measured.mean.high else None
        shown = f"{m.measured.mean.value:,.1f}" + (f" +- {half:,.1f}" if half else "")
        table.add_row("measured", f"{shown} {unit} (95% CI, n={m.measured.n})")
    if m.ratio is not None:
        band = (
            f" [{m.ratio.low:.3f}, {m.ratio.high:.3f}]"
            if m.ratio.low is not None and m.ratio.high is not None
            else ""
        )
        table.add_row(
            "vs the winner",
            f"{m.ratio.value:.3f}{band} (tolerance {100 * explanation.tolerance:g}%)",
        )
    if base is not None and base.throughput and m.measured.mean is not None:
        table.add_row("gain over baseline", f"{m.measured.mean.value / base.throughput:,.1f}x")
    shown_trial = redact_trial(trial)
    for label, text in shown_trial.telemetry.rows() if shown_trial.telemetry else ():
        table.add_row(label, Text(text))
    table.add_row("config", Text(json.dumps(shown_trial.config, sort_keys=True)))
    for name, svc in shown_trial.services.items():
        table.add_row(Text(f"{name} command"), Text(svc.command))
    for d in m.decisions:
        table.add_row(Text(f"{d.action} {d.change}"), Text(d.why))
    console.print(table)
    return trial


def _print_best(
    winner: Any, base: Any, gain: float | None, estimate: Any, *, cards: dict[str, int]
) -> None:
    from autotune.results import cards_text, format_estimate, machines_of, objective_label
    from autotune.telemetry import short_machine

    m = winner.metrics or {}
    table = Table(title=f"best feasible trial #{winner.number}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    what, unit = objective_label(winner.metric_names)
    table.add_row(what, format_estimate(estimate, unit))
    if what != "output throughput" and winner.metrics.get("output_throughput") is not None:
        table.add_row("output throughput", f"{winner.metrics['output_throughput']:,.1f} tok/s")
    if estimate.half_width is not None:
        table.add_row(
            "conservative estimate",
            f"{estimate.lower:,.1f} {unit} (lower 95% bound, what configurations are ranked by)",
        )
        table.add_row(
            "run-to-run noise",
            f"{100 * (estimate.noise_sd or 0):.1f}% (pooled over the repeated measurements, "
            f"{estimate.noise_df} df)",
        )
    machines = machines_of(estimate.measurements)

    def gpu(machine: str | None) -> str:
        return short_machine(machine) if machine else "no GPU recorded"

    runs = []
    for x in estimate.measurements:
        label = f"trial #{x.of}" if x.repeat == 0 else f"re-run {x.repeat}"
        if len(machines) > 1:
            label += f" [{gpu(x.machine)}]"
        if x.full and x.throughput is not None:
            runs.append(f"{label}: {x.throughput:,.1f}")
        elif x.aborted:
            runs.append(f"{label}: aborted early")
        else:
            runs.append(f"{label}: {x.failure or 'infeasible'}")
    table.add_row(f"measurements ({unit})", Text("; ".join(runs)))
    if len(machines) > 1:
        counts = ", ".join(f"{gpu(m)}: {n}" for m, n in machines.items())
        table.add_row(
            "measured on",
            Text(
                f"{len(machines)} machines ({counts}): the mean and its interval carry any "
                "difference between them"
            ),
        )
    across = cards_text(cards, [x.card for x in estimate.measurements])
    if across is not None:
        table.add_row("the study's GPUs", Text(across))
    if base is not None and base.metrics:
        table.add_row(
            f"baseline (trial #{base.number})",
            f"{base.throughput or 0:,.1f} {unit}",
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
    for name, counted in (winner.server_metrics or {}).items():
        table.add_row(Text(f"{name} (its /metrics)"), Text(server_metrics_text(counted)))
    if winner.telemetry is not None:  # None: the trial predates GPU telemetry
        for label, text in winner.telemetry.rows():
            table.add_row(label, Text(text))
    for name, version in (winner.engine_version or {}).items():
        table.add_row(Text(f"{name} version"), Text(version))
    table.add_row("config", Text(json.dumps(winner.config, sort_keys=True)))
    for name, svc in (winner.services or {}).items():
        table.add_row(Text(f"{name} command"), Text(svc.command))
        if svc.inherited_env:  # set in autotune's shell, read by the engine: part of the run
            pairs = " ".join(f"{k}={v}" for k, v in svc.inherited_env.items())
            table.add_row(Text(f"{name} inherited"), Text(pairs))
    if winner.overrides:
        table.add_row("server overrides", Text("\n".join(winner.overrides)))
    console.print(table)


@friendly
def report(
    study: str = StudyOpt,
    storage: str | None = StorageOpt,
    out: Path | None = typer.Option(None, "--out", help="HTML file (default reports/NAME.html)."),
) -> None:
    """Write one self-contained HTML report (Pareto front, history, importances, the
    explanation `autotune explain` stored, top 10)."""
    from autotune.report import write_report

    check_study(study)
    target = out or Path("reports") / f"{study}.html"
    check_out(target, option="--out", directory=False)
    opened = open_existing(study, storage)
    with writing("--out"):
        path = write_report(opened, path=target)
    say(f"report written: {path}")


@friendly
def status(
    study: str = StudyOpt,
    storage: str | None = StorageOpt,
    study_file: Path | None = typer.Option(
        None,
        "--study-file",
        help="Study definition whose services' inherited environment (this shell's) is "
        "compared with the newest trial's (default: studies/STUDY.yaml when it exists).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the status as JSON."),
) -> None:
    """Workers of the study (running, lost, stopped) and what each is doing, running trials,
    trial counts (reused, infeasible, aborted, duplicate configurations), the best so far, and
    whether this shell gives the services the variables the newest trial ran with."""
    from autotune.study.status import study_status
    from autotune.study.status_view import render_status, status_json
    from autotune.study.storage import storage_errors

    check_study(study)
    opened = open_existing(study, storage)
    services = _shell_services(study, study_file)
    with storage_errors(storage_url(study, storage), f"reading study {study!r}"):
        current = study_status(opened, services=services)
    if as_json:
        sys.stdout.write(json.dumps(status_json(current), indent=2) + "\n")
        return
    # Every string a user or worker wrote (study, worker, host, phase) is a rich Text in
    # the renderable, never markup: a "[/]" in a worker name prints as it is.
    console.print(render_status(current))


def _shell_services(
    study: str, study_file: Path | None
) -> dict[str, ServiceRecord] | EnvironmentCheck | None:
    """What this shell would start for ``study`` (its baseline's services, with what they
    inherit), ``None`` without a study file; a file that does not load gives a check that
    says so, not an error: the status is read from the storage and stands without it."""
    from autotune.study.environment import EnvironmentCheck, shell_services

    path = study_file_path(study, study_file)
    if not path.is_file():
        if study_file is not None:
            raise ConfigError(f"{path}: study file not found", field="--study-file")
        return None
    try:
        _, space, deployment, run_dir = deployment_context(study, study_file)
        return shell_services(space, deployment, run_dir=run_dir)
    except AutotuneError as exc:
        return EnvironmentCheck(error=f"{path}: {exc}")


def server_metrics_text(counted: dict[str, Any]) -> str:
    """One line of what a server counted itself: the figures a person compares first."""
    if "error" in counted:
        return f"not scraped: {counted['error']}"
    parts = []
    for key, label, scale, fmt in (
        ("ttft_mean_s", "TTFT", 1000, "{:.1f} ms"),
        ("tpot_mean_s", "TPOT", 1000, "{:.2f} ms"),
        ("kv_usage_max", "KV cache peak", 100, "{:.1f}%"),
        ("running_max", "running peak", 1, "{:.0f}"),
        ("queued_max", "queued peak", 1, "{:.0f}"),
        ("preemptions", "preemptions", 1, "{:.0f}"),
        ("prefix_cache_hit_rate", "prefix-cache hits", 100, "{:.1f}%"),
        ("spec_acceptance_rate", "spec acceptance", 100, "{:.1f}%"),
        ("spec_accept_length_mean", "spec accept length", 1, "{:.2f}"),
    ):
        value = counted.get(key)
        if isinstance(value, (int, float)):
            parts.append(f"{label} {fmt.format(value * scale)}")
    return "; ".join(parts) or "nothing exported"
