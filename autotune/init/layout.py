"""The deployment around the services: names, start order, endpoint, hosts, GPUs.

The services come from separate sources (a command line each, units, containers); what ties
them together is in their own commands: a router names its workers (``--prefill URL
BOOTSTRAP``, ``--decode URL``, ``--worker-urls``), so it starts after them (``depends_on``) and
is where the load goes. The deployment file keeps every command as it is, with its literal
ports, so rendering the baseline gives the same command line back; ``port:`` and ``host:``
say where each service answers, which the health checks and the load use.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from autotune.errors import ConfigError
from autotune.init.model import ImportedService
from autotune.pinned_env import PINNED_ENV

_NAME = re.compile(r"[^A-Za-z0-9_-]+")
_LOCAL = {"127.0.0.1", "localhost", "0.0.0.0", "::1", "::"}


def name_services(services: list[ImportedService]) -> None:
    """Each service's name: its source's own (a compose service, a k8s label) when it has
    one, else its role (``prefill``, ``decode``, ``router``, ``server``); ``-2``, ``-3`` for
    more of the same."""
    taken: set[str] = set()
    for service in services:
        base = _NAME.sub("-", service.raw.name_hint or service.role).strip("-_") or "server"
        if not base[0].isalpha() and base[0] != "_":
            base = "s-" + base
        name, n = base, 2
        while name in taken:
            name, n = f"{base}-{n}", n + 1
        service.name = name
        taken.add(name)


def worker_urls(router: ImportedService) -> list[str]:
    """The URLs a router sends to, in its command's order."""
    out: list[str] = []
    for option in router.options:
        if option.flag in ("--prefill", "--decode") and option.values:
            out.append(option.values[0])
        elif option.flag == "--worker-urls":
            out += option.values
    return out


def _same_place(url: str, service: ImportedService) -> bool:
    parts = urlsplit(url)
    if parts.port != service.port:
        return False
    host = parts.hostname or ""
    return host == service.host or (host in _LOCAL and service.host in _LOCAL)


_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<host>[^/:\s@]+):(?P<port>\d+)")


def resolve_network_names(services: list[ImportedService], notes: list[str]) -> None:
    """URLs that name another service by its container network name (``http://prefill:30000``
    in a compose file or a Kubernetes manifest) point where autotune runs that service
    (``http://127.0.0.1:30000``): on this machine no such name resolves."""
    by_name = {s.raw.network_name: s for s in services if s.raw.network_name}
    if not by_name:
        return

    replaced: set[str] = set()

    def sub(match: re.Match[str]) -> str:
        target = by_name.get(match.group("host"))
        if target is None:
            return match.group(0)
        replaced.add(match.group("host"))
        return f"{match.group('scheme')}://{target.host}:{match.group('port')}"

    for service in services:
        replaced.clear()
        changed = False
        for option in service.options:
            values = [_URL.sub(sub, v) for v in option.values]
            if values != option.values:
                option.values, changed = values, True
                if isinstance(option.value, list):
                    option.value = list(values)
                elif isinstance(option.value, str):
                    option.value = " ".join(values)
        for key, value in service.env.items():
            new = _URL.sub(sub, value)
            if new != value:
                service.env[key], changed = new, True
        if changed:
            notes.append(
                f"service {service.name}: URLs naming "
                + ", ".join(sorted(replaced))
                + " by their container network names point where autotune runs them"
            )


def link_services(services: list[ImportedService], notes: list[str]) -> None:
    """``depends_on`` of each router: the imported services its worker URLs name. A URL no
    imported service answers is said, not guessed at."""
    for router in services:
        if router.role != "router":
            continue
        for url in worker_urls(router):
            match = [s for s in services if s is not router and _same_place(url, s)]
            if len(match) == 1:
                if match[0].name not in router.depends_on:
                    router.depends_on.append(match[0].name)
            else:
                notes.append(
                    f"service {router.name}: worker {url} is none of the imported services: "
                    "autotune will not start it (import its command too to tune it)"
                )
        for name in router.raw.depends_on:
            if name not in router.depends_on and any(s.name == name for s in services):
                router.depends_on.append(name)
    for service in services:
        if service.role == "router":
            continue
        service.depends_on = [
            d for d in service.raw.depends_on if any(s.name == d for s in services)
        ]


def endpoint(services: list[ImportedService], given: str | None) -> ImportedService:
    """Where the load goes: ``--endpoint``, else the one router, else the one service."""
    if given is not None:
        for service in services:
            if service.name == given:
                return service
        raise ConfigError(
            f"no service named {given!r}", field="--endpoint", allowed=[s.name for s in services]
        )
    routers = [s for s in services if s.role == "router"]
    if len(routers) == 1:
        return routers[0]
    if len(services) == 1:
        return services[0]
    raise ConfigError(
        f"{len(services)} services and "
        + ("no router" if not routers else f"{len(routers)} routers")
        + ": which one takes the load? give --endpoint NAME",
        field="--endpoint",
        allowed=[s.name for s in services],
    )


def escape(text: str) -> str:
    """A literal ``${`` written ``$${`` (a deployment's template syntax), except the
    ``${env:VAR}`` references of credentials."""
    out = text.replace("${", "$${")
    return re.sub(r"\$\$\{(env:[A-Za-z_][A-Za-z0-9_]*)\}", r"${\1}", out)


def deployment_dict(
    name: str,
    services: list[ImportedService],
    front: ImportedService,
    *,
    description: str,
    notes: list[str],
) -> dict[str, Any]:
    """The deployment file's content (see the module docstring)."""
    hosts: dict[str, Any] = {}
    out_services: dict[str, Any] = {}
    for service in _ordered(services):
        out_services[service.name] = _service_dict(service, hosts, notes)
    data: dict[str, Any] = {
        "name": name,
        "description": description,
        "endpoint": f"http://${{{front.name}.host}}:${{{front.name}.port}}",
    }
    model = _model(services, front)
    if model is not None:
        data["model"] = model
    data["run_dir"] = "studies/runs/${deployment}"
    speedup = _sim_speedup(services)
    if speedup is not None:
        data["sim_speedup"] = speedup
    counts = [s.gpu_count for s in services if s.role != "router"]
    if counts and all(c is not None for c in counts):
        data["gpus"] = sum(c for c in counts if c is not None)
    if hosts:
        data["hosts"] = hosts
    data["services"] = out_services
    return data


def _ordered(services: list[ImportedService]) -> list[ImportedService]:
    """Workers before the routers that depend on them (the file reads in start order)."""
    return [s for s in services if s.role != "router"] + [s for s in services if s.role == "router"]


def _service_dict(
    service: ImportedService, hosts: dict[str, Any], notes: list[str]
) -> dict[str, Any]:
    argv = service.argv()
    wrapper, command = argv[: len(service.wrapper)], argv[len(service.wrapper) :]
    out: dict[str, Any] = {"command": [escape(t) for t in command]}
    if wrapper:
        out["wrapper"] = [escape(t) for t in wrapper]
    env = {}
    for key, value in service.env.items():
        if key in PINNED_ENV:
            if value != PINNED_ENV[key]:
                notes.append(
                    f"service {service.name}: {key}={value} not kept: autotune keeps NVLink "
                    f"multicast off in every service it starts ({key}={PINNED_ENV[key]}, "
                    "autotune/pinned_env.py)"
                )
            continue
        env[key] = escape(value)
    if env:
        out["env"] = env
    out["host"] = service.host
    out["port"] = service.port
    health: dict[str, Any] = {"url": "http://${host}:${port}" + service.health_path}
    out["health"] = health
    if service.info_path:
        out["info_url"] = "http://${host}:${port}" + service.info_path
    if service.metrics_path:
        out["metrics_url"] = "http://${host}:${port}" + service.metrics_path
    if service.raw.workdir:
        out["workdir"] = escape(service.raw.workdir)
    if service.depends_on:
        out["depends_on"] = list(service.depends_on)
    if service.raw.host is not None:
        host_name, spec = service.raw.host
        if service.raw.unit_dir and service.raw.unit_dir != spec.systemd_unit_dir:
            spec = spec.model_copy(update={"systemd_unit_dir": service.raw.unit_dir})
        hosts[host_name] = spec.model_dump(exclude_defaults=True)
        for jump, jump_spec in service.raw.jump_hosts.items():
            hosts.setdefault(jump, jump_spec.model_dump(exclude_defaults=True))
        out["on"] = host_name
    if service.raw.manager == "systemd":
        out["manager"] = "systemd"
        out["unit"] = service.raw.unit
    elif service.raw.host is not None:
        out["manager"] = "process"
    return out


def _model(services: list[ImportedService], front: ImportedService) -> str | None:
    """The served model name requests send: the front's, else its workers'."""
    for service in [front, *services]:
        if service.role != "router" and service.model:
            return service.model
    return None


def _sim_speedup(services: list[ImportedService]) -> float | None:
    """The simulated servers' speed-up (``AUTOTUNE_SIM_SPEEDUP``), so that their figures are
    converted back to the modeled hardware's time (``sim_speedup`` of the deployment)."""
    values = set()
    for service in services:
        text = service.env.get("AUTOTUNE_SIM_SPEEDUP")
        if text is not None:
            try:
                values.add(float(text))
            except ValueError:
                continue
    if len(values) == 1:
        value = values.pop()
        return int(value) if value.is_integer() else value
    return None
