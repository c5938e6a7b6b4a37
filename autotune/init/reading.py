"""One service read through its engine: program, typed options, where it answers, its role.

From a :class:`~autotune.init.model.RawService` (argv and environment as its source spells
them) to an :class:`~autotune.init.model.ImportedService`: the engine and release
(:mod:`autotune.init.engines`), the options and variables typed by that release's parser
(:mod:`autotune.init.options`), and what the deployment file needs that the command implies:
the port and host it listens on (its ``--port``/``--host``, else the parser's default), its
health, info and metrics endpoints (each engine's own: SGLang's ``/server_info``, vLLM's
``/version``, the PD router's ``/readiness``), its role (``--disaggregation-mode``) and whether
it runs on a CPU or GPUs. What none of that tells (a generic program's port or health URL) is
an error that says what to give, never a guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from autotune.errors import ConfigError
from autotune.init import commandline
from autotune.init.engines import GENERIC, ServerReport, choose_engine, find_program
from autotune.init.model import ImportedService, RawService
from autotune.init.options import read_env, read_options

_WILDCARD = {"", "0.0.0.0", "::", "[::]", "*"}
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
_ROUTER_ENGINES = {"sglang-router"}
_HEALTH = {"sglang": "/health", "vllm": "/health", "transformers-serve": "/health"}
"""Readiness: SGLang's /health (503 while starting), vLLM's /health (200 once the engine is
up), transformers serve's /health (once the weights are loaded); DOMAIN.md section 3."""
_INFO = {"sglang": "/server_info", "vllm": "/version"}


@dataclass
class ReadOptions:
    """What the user said about all services (``autotune init``'s options)."""

    reports: list[ServerReport] = field(default_factory=list)
    versions: Mapping[str, str] = field(default_factory=dict)
    """Engine name -> release (``--engine-version``); ``""`` keys apply to every engine."""
    platform: Literal["cpu", "gpu"] | None = None
    health: Mapping[str, str] = field(default_factory=dict)
    """Service name (or ``""`` for all) -> health path (``--health``)."""


def read_service(raw: RawService, opts: ReadOptions, notes: list[str]) -> ImportedService:
    """``raw`` read with its engine's parser (see the module docstring)."""
    argv = raw.argv
    found = find_program(argv)
    report = _report_for(raw, opts.reports, found.engine if found is not None else None)
    if found is not None:
        name = found.engine
        start = commandline.program_start(argv, found.end, found.words)
        after = found.end
    else:
        name = report.engine if report is not None else GENERIC
        start = commandline.generic_program_start(argv)
        after = start + 1
    version = opts.versions.get(name) or (
        opts.versions.get("") if name not in _ROUTER_ENGINES else None
    )
    engine, how = choose_engine(name, report=report, version=version, origin=raw.origin)
    notes.append("engine: " + how)
    if engine.manifest is None:  # generic: options are what render edits, from the first --
        first = next((i for i in range(after, len(argv)) if argv[i].startswith("--")), len(argv))
    else:
        first = commandline.options_start(argv, after)
    service_notes: list[str] = []
    options, moved = read_options(engine, argv[first:], origin=raw.origin, notes=service_notes)
    service = ImportedService(
        name=raw.name_hint or "",
        raw=raw,
        engine=engine,
        wrapper=argv[:start],
        head=[*argv[start:first], *moved],
        options=options,
        env=dict(raw.env),
        typed_env=read_env(engine, raw.env, origin=raw.origin),
        program_len=(after - start) if found is not None else 1,
        notes=service_notes,
    )
    service.role = _role(service)
    service.platform = _platform(service, opts, report)
    service.port = _port(service)
    service.host = _host(service)
    service.health_path = _health(service, opts)
    service.info_path = _INFO.get(engine.name)
    service.metrics_path = _metrics(service)
    notes.extend(service_notes)
    return service


def _report_for(
    raw: RawService, reports: list[ServerReport], engine: str | None
) -> ServerReport | None:
    """The ``--url`` report of this service: the one at the port its command names, else the
    one report of its program's engine (a release is one per engine in a deployment)."""
    for report in reports:
        port = report.url.rsplit(":", 1)[-1].split("/", 1)[0]
        for i, word in enumerate(raw.argv):
            if word == f"--port={port}" or (word == "--port" and raw.argv[i + 1 : i + 2] == [port]):
                return report
    same = [r for r in reports if engine is not None and r.engine == engine]
    return same[0] if len(same) == 1 else None


def _role(service: ImportedService) -> str:
    if service.engine.name in _ROUTER_ENGINES:
        return "router"
    mode = service.option("--disaggregation-mode")
    if mode is not None and mode.text in ("prefill", "decode"):
        return mode.text
    return "server"


def _platform(
    service: ImportedService, opts: ReadOptions, report: ServerReport | None
) -> Literal["cpu", "gpu"]:
    """CPU or GPU: the user's --platform, else what the service says (a CPU device, the
    CPU build's variables or version, visible GPUs), else GPU for SGLang and vLLM (GPU
    engines first) and CPU for the rest (no GPU-only lever proposed without evidence)."""
    if opts.platform is not None:
        return opts.platform
    if service.role == "router":
        return "cpu"
    device = service.option("--device")
    if device is not None:
        return "cpu" if device.text == "cpu" else "gpu"
    if any(name.startswith("VLLM_CPU_") for name in service.env):
        return "cpu"
    if report is not None and report.version and "cpu" in report.version:
        return "cpu"
    if service.gpu_count or "CUDA_VISIBLE_DEVICES" in service.env:
        return "gpu"
    if service.engine.name in ("sglang", "vllm"):
        return "gpu"
    service.notes.append(
        f"{service.raw.origin}: no sign of a GPU: only levers that work on a CPU are proposed "
        "(give --platform gpu for the others)"
    )
    return "cpu"


def _port(service: ImportedService) -> int:
    option = service.option("--port")
    text = option.text if option is not None else None
    if text is not None and text.isdigit():
        return int(text)
    manifest = service.engine.manifest
    info = manifest.option("--port") if manifest is not None else None
    if option is None and info is not None and isinstance(info.default, int):
        service.notes.append(
            f"{service.raw.origin}: no --port: {service.engine.name}'s default {info.default}"
        )
        return info.default
    if option is None and service.raw.container_port is not None:
        return service.raw.container_port
    raise ConfigError(
        f"{service.raw.origin}: cannot tell which port it listens on"
        + (f" (--port {text!r})" if text is not None else "")
        + ": give it --port N in its command",
        field="--port",
    )


def _host(service: ImportedService) -> str:
    """Where the tuner reaches it: its --host, the SSH host's address for a wildcard."""
    option = service.option("--host")
    listen = option.text if option is not None and option.values else ""
    if listen in _WILDCARD or (option is None and service.engine.name == "vllm"):
        listen = ""
    if service.raw.host is not None:
        address = service.raw.host[1].address
        if listen in _LOOPBACK and address not in _LOOPBACK:
            raise ConfigError(
                f"{service.raw.origin}: it listens on {listen} of {service.raw.host[0]}, which "
                "this machine cannot reach for health checks and load: make it listen on an "
                "address this machine reaches (--host 0.0.0.0)",
                field="--host",
            )
        return listen or address
    if not listen:
        return "127.0.0.1"
    return "127.0.0.1" if listen == "localhost" else listen


def _health(service: ImportedService, opts: ReadOptions) -> str:
    given = opts.health.get(service.raw.name_hint or "") or opts.health.get("")
    if given:
        return given if given.startswith("/") else "/" + given
    if service.raw.health_path:
        return service.raw.health_path
    if service.role == "router":
        # sglang_router: /readiness answers 200 once its workers are registered (its /health
        # at once), the gate the bundled PD deployments use.
        return "/readiness" if service.option("--pd-disaggregation") else "/health"
    path = _HEALTH.get(service.engine.name)
    if path is None:
        raise ConfigError(
            f"{service.raw.origin}: no engine autotune knows, so no health URL to wait for: "
            "give --health PATH (the path that answers HTTP 200 once it serves, e.g. /health)",
            field="--health",
        )
    return path


def _metrics(service: ImportedService) -> str | None:
    if service.engine.name == "vllm":
        return "/metrics"
    if service.engine.name == "sglang" and service.option("--enable-metrics") is not None:
        return "/metrics"
    return None
