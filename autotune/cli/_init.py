"""``autotune init``: a deployment, a space and a study from what runs today.

autotune's modules are imported inside the command: the engines, the catalog and the checks
load pydantic, PyYAML and Optuna, which ``autotune --help`` must not pay.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, cast

import typer

from autotune.cli._common import check_out, check_url, friendly, say, writing
from autotune.errors import ConfigError


def _pairs(values: list[str] | None, *, option: str) -> dict[str, str]:
    """``NAME=VALUE`` (or a bare ``VALUE``, key ``""``: every one) per item."""
    out: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep:
            key, value = "", item
        if not value:
            raise ConfigError(f"{item!r}: expected NAME=VALUE or VALUE", field=option)
        out[key] = value
    return out


@friendly
def init(
    from_command: list[str] | None = typer.Option(
        None,
        "--from-command",
        help="A command line that runs a service today, with its variables "
        '("HF_TOKEN=... vllm serve MODEL --port 8000"); one per service, repeatable.',
    ),
    from_systemd: list[str] | None = typer.Option(
        None,
        "--from-systemd",
        help="A unit file here, or HOST:UNIT (systemctl cat over SSH, plus its "
        "EnvironmentFile=s); HOST is a name of --hosts, or ADDRESS, USER@ADDRESS or "
        "USER@ADDRESS:PORT. Repeatable.",
    ),
    from_compose: Path | None = typer.Option(
        None, "--from-compose", help="A docker compose file (every service, or --service)."
    ),
    service: list[str] | None = typer.Option(
        None, "--service", help="A compose service to import (repeatable; default: all)."
    ),
    from_k8s: Path | None = typer.Option(
        None,
        "--from-k8s",
        help="Kubernetes manifests, a file or a directory of them (Deployment, StatefulSet, "
        "LeaderWorkerSet; several documents).",
    ),
    url: list[str] | None = typer.Option(
        None,
        "--url",
        help="A running server (http://HOST:PORT): its engine and release from SGLang's "
        "/server_info or vLLM's /version. Repeatable.",
    ),
    engine_version: list[str] | None = typer.Option(
        None,
        "--engine-version",
        help="Release whose parser reads the commands: ENGINE=VERSION or VERSION (default: "
        "the running server's with --url, else the release autotune pins).",
    ),
    platform: str | None = typer.Option(
        None, "--platform", help="cpu or gpu, when the commands do not tell."
    ),
    health: list[str] | None = typer.Option(
        None,
        "--health",
        help="Health path (SERVICE=PATH or PATH) for a server autotune knows no endpoint of.",
    ),
    endpoint: str | None = typer.Option(
        None, "--endpoint", help="The service that takes the load (default: the router)."
    ),
    name: str | None = typer.Option(
        None, "--name", help="Name of the deployment, space and study (default: engine-model)."
    ),
    out: Path = typer.Option(
        Path("."),
        "--out",
        help="Directory to write launchers/NAME.yaml, search_spaces/NAME.yaml and "
        "studies/NAME.yaml into.",
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite existing files."),
    hosts: Path | None = typer.Option(
        None, "--hosts", help="A YAML file with a hosts: map (a deployment file will do)."
    ),
    ssh_key: str | None = typer.Option(None, "--ssh-key", help="Key file for HOST:UNIT."),
    known_hosts: str | None = typer.Option(
        None, "--known-hosts", help="known_hosts file for HOST:UNIT (default ~/.ssh/known_hosts)."
    ),
    concurrency: int = typer.Option(16, "--concurrency", min=1, help="The study's load."),
    input_len: int = typer.Option(256, "--input-len", min=1, help="Prompt tokens."),
    output_len: int = typer.Option(128, "--output-len", min=1, help="Output tokens."),
    requests: int = typer.Option(64, "--requests", min=1, help="Measured requests a trial."),
) -> None:
    """Write a deployment, a search space and a study from what runs today: command lines,
    systemd units (here or over SSH), a compose file or Kubernetes manifests. Every option
    is read with the engine's own parser; the baseline is exactly what runs now; credentials
    become ${env:VAR} references; the space proposes the engine's known levers around
    today's values (each citing its source) and passes `autotune space check`."""
    from autotune.init.importer import InitRequest, LoadSettings, import_services
    from autotune.init.writer import write

    if platform not in (None, "cpu", "gpu"):
        raise ConfigError(
            f"unknown platform {platform!r}", field="--platform", allowed=["cpu", "gpu"]
        )
    check_out(out, option="--out", directory=True)
    load = LoadSettings(concurrency, input_len, output_len, requests)
    request = InitRequest(
        commands=list(from_command or []),
        systemd=list(from_systemd or []),
        compose=from_compose,
        compose_services=list(service or []),
        k8s=from_k8s,
        urls=[check_url(u) for u in url or []],
        versions=_pairs(engine_version, option="--engine-version"),
        platform=cast(Literal["cpu", "gpu"] | None, platform),
        health=_pairs(health, option="--health"),
        name=name,
        endpoint=endpoint,
        hosts_file=hosts,
        ssh_key=ssh_key,
        known_hosts=known_hosts,
        load=load,
    )
    imported = import_services(request)
    for note in imported.notes:
        say(note)
    for service_ in imported.services:
        say(
            f"service {service_.name}: {service_.engine.name}"
            f"{' ' + service_.engine.version if service_.engine.version else ''} "
            f"({service_.role}, {service_.platform}) at {service_.host}:{service_.port}, "
            f"health {service_.health_path}"
            + (f", after {', '.join(service_.depends_on)}" if service_.depends_on else "")
        )
    for secret in imported.secrets:
        say(str(secret))
    with writing("--out"):
        written = write(imported, out, load, force=force)
    proposed = imported.proposed
    say(f"wrote {written.deployment} (endpoint: service {imported.front.name})")
    say(f"wrote {written.space} ({len(proposed.params)} levers: {', '.join(proposed.params)})")
    say(f"wrote {written.study}")
    for changes, recipe in proposed.enqueue:
        shown = ", ".join(f"{k}={v}" for k, v in changes.items())
        say(f"recipe {recipe.name} enqueued after the baseline: {shown} ({recipe.cite})")
    for finding in written.findings:
        say(finding)
    say(f"space check: ok ({written.checked} rendered commands read with the engines' parsers)")
    here = written.study.resolve() == (Path("studies") / f"{imported.name}.yaml").resolve()
    study_file = "" if here else f" --study-file {written.study}"
    say("next:")
    say(f"  autotune run --study {imported.name}{study_file} --trials 20")
    say(f"  autotune best --study {imported.name} --export systemd --out deploy/{imported.name}")
