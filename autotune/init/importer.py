"""``autotune init``: from what runs now to a deployment, a space and a study.

The steps, each in its own module: the sources give raw services (:mod:`.commandline`,
:mod:`.systemd`, :mod:`.compose`, :mod:`.k8s`); each is read with its engine's parser
(:mod:`.reading`); services are named and linked (:mod:`.layout`); credentials become
references (:mod:`.secrets`); the catalog proposes the levers (:mod:`.catalog`,
:mod:`.proposal`); the files are written, checked and put in place (:mod:`.writer`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from autotune.errors import ConfigError
from autotune.hosts import HostSpec
from autotune.init import layout
from autotune.init.commandline import split_command
from autotune.init.engines import probe_server
from autotune.init.model import ImportedService, RawService, SecretNote
from autotune.init.proposal import Proposed, propose
from autotune.init.reading import ReadOptions, read_service
from autotune.init.secrets import take_secrets

_HOST_RE = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9_][A-Za-z0-9_.-]*)@)?(?P<address>[^:@]+)(?::(?P<port>\d+))?$"
)


@dataclass
class LoadSettings:
    """The study's load (what the trials measure)."""

    concurrency: int = 16
    input_len: int = 256
    output_len: int = 128
    requests: int = 64


@dataclass
class InitRequest:
    """Everything ``autotune init`` was told."""

    commands: list[str] = field(default_factory=list)
    systemd: list[str] = field(default_factory=list)
    compose: Path | None = None
    compose_services: list[str] = field(default_factory=list)
    k8s: Path | None = None
    urls: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    platform: Literal["cpu", "gpu"] | None = None
    health: dict[str, str] = field(default_factory=dict)
    name: str | None = None
    endpoint: str | None = None
    hosts_file: Path | None = None
    ssh_key: str | None = None
    known_hosts: str | None = None
    load: LoadSettings = field(default_factory=LoadSettings)


@dataclass
class Imported:
    """What the files are made of, and what to tell the user about them."""

    name: str
    services: list[ImportedService]
    front: ImportedService
    deployment: dict[str, Any]
    proposed: Proposed
    secrets: list[SecretNote]
    notes: list[str]
    sources: list[str]


def import_services(request: InitRequest) -> Imported:
    """Read every source, type every service, link them, propose the levers."""
    raws = _raw_services(request)
    if not raws:
        raise ConfigError(
            "nothing to import: give --from-command, --from-systemd, --from-compose or --from-k8s",
            field="--from-command",
        )
    reports = [probe_server(url) for url in request.urls]
    opts = ReadOptions(
        reports=reports,
        versions=request.versions,
        platform=request.platform,
        health=request.health,
    )
    notes: list[str] = [note for raw in raws for note in raw.notes]
    services = [read_service(raw, opts, notes) for raw in raws]
    layout.name_services(services)
    secrets: list[SecretNote] = []
    typed: list[ImportedService] = []
    for service in services:
        found = take_secrets(service.name, service.raw)
        if found:
            secrets += found
            again = read_service(service.raw, opts, [])  # the same command, with references
            again.name = service.name
            service = again
        typed.append(service)
    services = typed
    layout.resolve_network_names(services, notes)
    layout.link_services(services, notes)
    front = layout.endpoint(services, request.endpoint)
    name = request.name or _default_name(front, services)
    _check_name(name)
    proposed = propose(services)
    if not proposed.params:
        raise ConfigError(
            "no lever autotune knows applies to "
            + ", ".join(f"{s.name} ({s.engine.name})" for s in services)
            + ": the space would be empty; write one by hand (search_spaces/*.yaml are examples)"
        )
    _check_gpus(services)
    description = "Imported by `autotune init` from " + "; ".join(r.origin for r in raws)
    deployment = layout.deployment_dict(name, services, front, description=description, notes=notes)
    return Imported(
        name=name,
        services=services,
        front=front,
        deployment=deployment,
        proposed=proposed,
        secrets=secrets,
        notes=notes + proposed.notes,
        sources=[r.origin for r in raws],
    )


def _raw_services(request: InitRequest) -> list[RawService]:
    from autotune.init import compose, k8s, systemd

    out: list[RawService] = []
    for i, text in enumerate(request.commands, 1):
        parsed = split_command(text)
        raw = RawService(origin=f"--from-command #{i}", argv=parsed.argv, env=parsed.env)
        if parsed.unset:
            raw.notes.append(
                f"--from-command #{i}: `env -u {' '.join(parsed.unset)}` not kept (a service "
                "starts from autotune's environment; unset it there)"
            )
        out.append(raw)
    for item in request.systemd:
        path = Path(item)
        if path.is_file():
            out.append(systemd.from_unit_file(path))
            continue
        host, unit = _host_unit(item)
        name, hosts = _host_spec(host, request)
        out.append(systemd.from_host(name, hosts, unit))
    if request.compose is not None:
        out += compose.read_compose(request.compose, request.compose_services or None)
    elif request.compose_services:
        raise ConfigError("--service needs --from-compose", field="--service")
    if request.k8s is not None:
        out += k8s.read_k8s(request.k8s)
    return out


def _host_unit(item: str) -> tuple[str, str]:
    """``HOST:UNIT`` (HOST may be ``user@address:port``): the unit is after the last ':'."""
    host, sep, unit = item.rpartition(":")
    if not sep or not host or not unit:
        raise ConfigError(
            f"{item!r} is neither a unit file here nor HOST:UNIT", field="--from-systemd"
        )
    return host, unit


def _host_spec(host: str, request: InitRequest) -> tuple[str, dict[str, HostSpec]]:
    """A host named in ``--hosts FILE`` (a ``hosts:`` map, e.g. a deployment; with the hosts
    it is reached through), else ``[user@]address[:port]`` with ``--ssh-key`` and
    ``--known-hosts``."""
    if request.hosts_file is not None:
        from autotune.hosts import validate_hosts
        from autotune.yamlio import read_yaml

        data = read_yaml(request.hosts_file)
        entries = data.get("hosts") if isinstance(data, dict) else None
        if not isinstance(entries, dict):
            raise ConfigError("no hosts: map", file=str(request.hosts_file), field="hosts")
        if host in entries:
            specs = {k: HostSpec.model_validate(v) for k, v in entries.items()}
            validate_hosts(specs, file=str(request.hosts_file))
            chain = {host: specs[host]}
            while (jump := chain[list(chain)[-1]].jump) is not None and jump not in chain:
                chain[jump] = specs[jump]
            return host, chain
    match = _HOST_RE.match(host)
    if match is None:
        raise ConfigError(f"{host!r} is not [user@]address[:port]", field="--from-systemd")
    values: dict[str, Any] = {"address": match.group("address")}
    if match.group("user"):
        values["user"] = match.group("user")
    if match.group("port"):
        values["port"] = int(match.group("port"))
    if request.ssh_key:
        values["key_file"] = request.ssh_key
    if request.known_hosts:
        values["known_hosts"] = request.known_hosts
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", match.group("address"))
    return name, {name: HostSpec.model_validate(values)}


def _default_name(front: ImportedService, services: list[ImportedService]) -> str:
    worker = next((s for s in services if s.role != "router"), front)
    model = (worker.model or "").rstrip("/").rsplit("/", 1)[-1]
    base = f"{worker.engine.name}-{model}" if model else worker.engine.name
    return re.sub(r"[^a-z0-9_-]+", "-", base.lower()).strip("-") or "imported"


def _check_name(name: str) -> None:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]{0,99}", name):
        raise ConfigError(
            f"{name!r} cannot name a deployment, space and study (letters, digits, '_', '-', "
            "starting with a letter)",
            field="--name",
        )


def _check_gpus(services: list[ImportedService]) -> None:
    """Services that reserve GPUs without naming which (a k8s limit, a compose count) would
    share the same ones on one machine: asked for, not guessed."""
    local = [
        s
        for s in services
        if s.raw.host is None and s.raw.gpus and "CUDA_VISIBLE_DEVICES" not in s.env
    ]
    if len(local) > 1:
        raise ConfigError(
            "services "
            + ", ".join(f"{s.name} ({s.raw.gpus} GPUs)" for s in local)
            + " reserve GPUs without naming which; on one machine they would share them: set "
            "CUDA_VISIBLE_DEVICES in each service's environment",
            field="CUDA_VISIBLE_DEVICES",
        )
