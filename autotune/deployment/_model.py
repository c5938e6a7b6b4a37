"""The deployment file's models: :class:`Deployment`, its services and their health checks.

Held together because a :class:`Deployment` object is more than its fields: it picks the
``auto`` ports once (kept for the session, so fingerprints stay stable), works out the run
directory, the template values of each field and the endpoint, and checks ``client_cpus``.
The cross-field checks run at load are in :mod:`autotune.deployment._checks`, reading a file
in :mod:`autotune.deployment._loading`; import all of them from :mod:`autotune.deployment`.
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictInt,
    StrictStr,
    field_validator,
)
from pydantic_core import PydanticCustomError

from autotune.cpus import available_cpus, format_cpu_list, parse_cpu_list
from autotune.errors import ConfigError
from autotune.hosts import HostSpec
from autotune.ports import pick_free_ports
from autotune.specs import ServiceSpec
from autotune.templates import expand

PORT_AUTO = "auto"
_NAME_RX = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_HOST_NAME_RX = re.compile(r"[A-Za-z0-9_.-]+")
_UNIT_RX = re.compile(r"[A-Za-z0-9:_.@\\-]+")


class HealthCheck(BaseModel):
    """Readiness: ``url`` answers HTTP 200 within ``timeout_s`` of the start."""

    model_config = ConfigDict(extra="forbid")

    url: StrictStr = "http://${host}:${port}/health"
    timeout_s: float = Field(default=600.0, gt=0)


class ServiceDef(BaseModel):
    """One service as written in the file (templates unexpanded)."""

    model_config = ConfigDict(extra="forbid")

    command: list[StrictStr] = Field(min_length=1)
    """argv of the server; flags (``--x v`` / ``--x=v``) after the program are editable."""
    wrapper: list[StrictStr] = Field(default_factory=list)
    """argv put before ``command`` and never edited (``numactl --cpunodebind=0 ...``)."""
    env: dict[str, StrictStr] = Field(default_factory=dict)
    """Variables added to the inherited environment (values are strings: quote numbers)."""
    host: StrictStr = "127.0.0.1"
    port: int | Literal["auto"]
    """Fixed port, or ``auto``: a free port chosen once per session."""
    ports: dict[StrictStr, Any] = Field(default_factory=dict)
    """Extra ports the service listens on, by name (``bootstrap: auto``): each a fixed port or
    ``auto``, like ``port``; ``${ports.NAME}`` in the service, ``${SERVICE.ports.NAME}``
    elsewhere. Checked in :func:`autotune.deployment._checks._check`."""
    health: HealthCheck = Field(default_factory=HealthCheck)
    info_url: StrictStr | None = None
    """``/server_info`` URL: the resolved arguments, read once the service is healthy."""
    metrics_url: StrictStr | None = None
    """Prometheus ``/metrics`` URL, scraped before and after every measured phase: what the
    server itself counted (KV-cache usage, preemptions, prefix-cache hits, its TTFT)."""
    log_file: StrictStr = "${run_dir}/${service}.log"
    """Appended to on every start; a relative path is relative to the run directory."""
    workdir: StrictStr | None = None
    depends_on: list[StrictStr] = Field(default_factory=list)
    """Services that must be healthy before this one starts (the router's workers)."""
    on: StrictStr | None = None
    """Host (a key of the deployment's ``hosts:``) that runs the service over SSH; unset =
    this machine."""
    manager: Literal["local", "process", "systemd"] | None = None
    """``local`` (child process of the tuner), ``process`` (detached, pidfile, on the host) or
    ``systemd`` (drop-in on ``unit``). Default: ``local`` without ``on``, else ``process``."""
    unit: StrictStr | None = None
    """systemd unit name for ``manager: systemd`` (e.g. ``sglang-decode.service``)."""
    role: StrictStr | None = None
    """The search-space service whose levers this one takes: replicas of one role run the
    same settings (a second decode worker: ``role: decode``). Default: its own name."""

    def resolved_manager(self) -> str:
        if self.manager is not None:
            return self.manager
        return "local" if self.on is None else "process"

    @field_validator("port", mode="before")
    @classmethod
    def _port(cls, value: object) -> object:
        if value == PORT_AUTO:
            return value
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535:
            return value
        raise PydanticCustomError(
            "port",
            "must be an integer 1..65535 or 'auto', got {value}",
            {"value": repr(value), "allowed": ["1..65535", PORT_AUTO]},
        )

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.:-]+", value):
            raise PydanticCustomError(
                "host",
                "host {value} must be a plain name or address (no templates)",
                {"value": repr(value)},
            )
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str]) -> list[str]:
        if not value[0].strip():
            raise PydanticCustomError("command", "the program (first element) is empty", {})
        return value

    @field_validator("unit")
    @classmethod
    def _unit(cls, value: str | None) -> str | None:
        # systemd's own unit-name characters; never a path ('/'), an option ('-...') or '..'.
        if value is not None and (
            not _UNIT_RX.fullmatch(value) or value.startswith(("-", ".")) or ".." in value
        ):
            raise PydanticCustomError(
                "unit",
                "unit {value} is not a systemd unit name (letters, digits, ':', '_', '.', '@', "
                "'-', '\\'; e.g. sglang-decode.service)",
                {"value": repr(value)},
            )
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise PydanticCustomError(
                    "env_name", "invalid environment variable name {key}", {"key": repr(key)}
                )
        return value


class Deployment(BaseModel):
    """A deployment file. Load with :func:`load_deployment`."""

    model_config = ConfigDict(extra="forbid")

    name: StrictStr = Field(pattern=_NAME_RX.pattern)
    description: StrictStr = ""
    endpoint: StrictStr
    """Base URL the load goes to (usually the router), e.g. ``http://${router.host}:...``."""
    model: StrictStr | None = None
    """Served model name (what requests send as ``model``)."""
    run_dir: StrictStr = "studies/runs/${deployment}"
    hosts: dict[str, HostSpec] = Field(default_factory=dict)
    """SSH hosts services run on (``on:``); keys only, never passwords."""
    sim_speedup: float = Field(1.0, gt=0, le=100)
    """Simulated deployments only: the servers run this many times faster than the hardware
    they model (``${sim_speedup}`` passes it to them). Measured durations are multiplied back
    and throughputs divided, so every stored figure is in the modeled hardware's time."""
    gpus: StrictInt | None = Field(default=None, ge=1)
    """GPUs this deployment occupies in total (every service on every host; a simulated
    deployment: the hardware it models), for figures per GPU (the report's tok/s per GPU).
    Informational: nothing is placed or checked by it. Unset: unknown, and the report
    gives those figures per deployment."""
    client_cpus: StrictStr | None = None
    """CPUs of the tuner's machine kept for the load generator (``0``, ``0,2``, ``4-7``):
    the thread that measures runs only there, and local services (``manager: local``) start
    on the tuner's other CPUs (``taskset -c``) unless their command already starts with
    ``taskset``. For an engine that shares the tuner's cores: an open-loop schedule keeps to
    the millisecond only with a core apart (:mod:`autotune.cpus`). Unset: no placement."""
    services: dict[str, ServiceDef] = Field(min_length=1)

    _source: Path | None = PrivateAttr(default=None)
    _ports: dict[str, int] | None = PrivateAttr(default=None)
    _extra_ports: dict[str, dict[str, int]] | None = PrivateAttr(default=None)
    _services_cpus: frozenset[int] | None = PrivateAttr(default=None)

    @field_validator("services")
    @classmethod
    def _service_names(cls, value: dict[str, ServiceDef]) -> dict[str, ServiceDef]:
        for key in value:
            if not _NAME_RX.fullmatch(key):
                raise PydanticCustomError(
                    "service_name",
                    "service name {key} must be letters, digits, '_' or '-' (no dots)",
                    {"key": repr(key)},
                )
        return value

    @field_validator("client_cpus")
    @classmethod
    def _client_cpus(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            cpus = parse_cpu_list(value)
        except ValueError as exc:
            raise PydanticCustomError(
                "cpu_list", "{why}", {"why": str(exc), "allowed": ["0", "0,2", "4-7"]}
            ) from None
        return format_cpu_list(cpus)

    def client_cpu_set(self) -> frozenset[int] | None:
        """:attr:`client_cpus` as a set (``None``: unset)."""
        return None if self.client_cpus is None else parse_cpu_list(self.client_cpus)

    def services_cpu_set(self) -> frozenset[int] | None:
        """The tuner's CPUs left to local services (and the tuner's own helper threads) when
        :attr:`client_cpus` keeps some for the load generator; ``None``: unset. Checked and
        worked out once: the client's CPUs must be the tuner's, leave at least one, and
        ``taskset`` (what starts the services there) must be on PATH."""
        client = self.client_cpu_set()
        if client is None or self._services_cpus is not None:
            return self._services_cpus
        mine = available_cpus()
        where = {"file": self.file_label, "field": "client_cpus"}
        if not client <= mine:
            raise ConfigError(
                f"client_cpus {self.client_cpus} includes CPUs this process may not run on "
                f"(it may run on {format_cpu_list(mine)})",
                allowed=[format_cpu_list(mine)],
                **where,
            )
        if not mine - client:
            raise ConfigError(
                f"client_cpus {self.client_cpus} leaves no CPU for the services (this process "
                f"may run on {format_cpu_list(mine)})",
                **where,
            )
        if shutil.which("taskset") is None:
            raise ConfigError(
                "client_cpus starts local services with `taskset -c` (util-linux), which is "
                "not on PATH here",
                **where,
            )
        self._services_cpus = mine - client
        return self._services_cpus

    @field_validator("hosts")
    @classmethod
    def _host_names(cls, value: dict[str, HostSpec]) -> dict[str, HostSpec]:
        for key in value:
            if not _HOST_NAME_RX.fullmatch(key):
                raise PydanticCustomError(
                    "host_name",
                    "host name {key} must be letters, digits, '_', '.' or '-'",
                    {"key": repr(key)},
                )
        return value

    # ----------------------------------------------------------------- accessors
    @property
    def source(self) -> Path | None:
        """The file this deployment was loaded from."""
        return self._source

    @property
    def file_label(self) -> str:
        return str(self._source) if self._source else f"deployment '{self.name}'"

    def role_of(self, service: str) -> str:
        """The search-space service whose levers ``service`` takes (``role:``, else itself)."""
        return self.services[service].role or service

    def roles(self) -> dict[str, list[str]]:
        """Search-space service name -> the deployment's services that carry its levers."""
        out: dict[str, list[str]] = {}
        for name in self.services:
            out.setdefault(self.role_of(name), []).append(name)
        return out

    def ports(self) -> dict[str, int]:
        """Port per service; ``auto`` ports are chosen on the first call and then kept."""
        if self._ports is None:
            self._pick_ports()
        assert self._ports is not None
        return dict(self._ports)

    def extra_ports(self) -> dict[str, dict[str, int]]:
        """Extra ports per service (``ports:``), chosen with :meth:`ports` and kept."""
        if self._extra_ports is None:
            self._pick_ports()
        assert self._extra_ports is not None
        return {n: dict(p) for n, p in self._extra_ports.items()}

    def _pick_ports(self) -> None:
        # Every listener of the file: (service, extra port name or None for `port`).
        slots: list[tuple[str, str | None, int | str]] = []
        for n, s in self.services.items():
            slots.append((n, None, s.port))
            slots += [(n, k, v) for k, v in s.ports.items()]
        chosen: dict[tuple[str, str | None], int] = {
            (n, k): v for n, k, v in slots if isinstance(v, int)
        }
        by_host: dict[str, list[tuple[str, str | None]]] = {}
        for n, k, v in slots:
            if v == PORT_AUTO:
                by_host.setdefault(self.services[n].host, []).append((n, k))
        for host, keys in by_host.items():
            bind = "127.0.0.1" if host in ("localhost", "0.0.0.0") else host
            taken = {p for (m, _), p in chosen.items() if self.services[m].host == host}
            try:
                picked = pick_free_ports(bind, len(keys), exclude=taken)
            except OSError as exc:  # a name that does not resolve, another machine's IP
                first, extra = keys[0]
                raise ConfigError(
                    f"port auto: cannot pick a free port on host {host!r} "
                    f"({exc.strerror or exc}); auto works for an address of this machine "
                    "only, give a fixed port otherwise",
                    file=self.file_label,
                    field=f"services.{first}.port"
                    if extra is None
                    else f"services.{first}.ports.{extra}",
                ) from None
            chosen.update(zip(keys, picked, strict=True))
        self._ports = {n: chosen[(n, None)] for n in self.services}
        self._extra_ports = {
            n: {k: chosen[(n, k)] for k in s.ports} for n, s in self.services.items()
        }

    def default_run_dir(self, study: str | None = None) -> Path:
        """``run_dir`` with templates expanded, absolute (relative to the working directory);
        with ``study``, its subdirectory of that name (one state file and log set per study)."""
        if study is not None and (
            study in ("", ".", "..") or re.search(r"[/\\\x00-\x1f\x7f]", study)
        ):
            # The study's run directory must stay below run_dir (no '../', no '/').
            raise ConfigError(
                f"study name {study!r} cannot be a directory name below run_dir",
                field="--study",
            )
        text = expand(
            self.run_dir, {"deployment": self.name}, file=self.file_label, field="run_dir"
        )
        path = Path(text).expanduser().resolve()
        return path / study if study else path

    def template_context(self, *, run_dir: Path, service: str | None = None) -> dict[str, str]:
        """Template values for a field of ``service`` (or a top-level field)."""
        ports = self.ports()
        extra = self.extra_ports()
        ctx = {
            "python": sys.executable,
            "deployment": self.name,
            "run_dir": str(run_dir),
            "sim_speedup": f"{self.sim_speedup:g}",
            "deployment_dir": str((self._source.parent if self._source else Path()).resolve()),
        }
        for n, s in self.services.items():
            ctx[f"{n}.host"] = s.host
            ctx[f"{n}.port"] = str(ports[n])
            ctx.update({f"{n}.ports.{k}": str(p) for k, p in extra[n].items()})
        if self.model is not None:
            ctx["model"] = self.model
        if service is not None:
            svc = self.services[service]
            ctx.update({"service": service, "host": svc.host, "port": str(ports[service])})
            ctx.update({f"ports.{k}": str(p) for k, p in extra[service].items()})
        return ctx

    def endpoint_url(
        self, specs: Mapping[str, ServiceSpec] | None = None, *, run_dir: Path | None = None
    ) -> str:
        """The ``endpoint`` with templates resolved: where the load goes.

        With ``specs`` (what :func:`autotune.render.render` returned), hosts and ports come
        from them, i.e. from what actually runs.
        """
        rd = run_dir if run_dir is not None else self.default_run_dir()
        ctx = self.template_context(run_dir=rd)
        for name, spec in (specs or {}).items():
            ctx[f"{name}.host"] = spec.host
            ctx[f"{name}.port"] = str(spec.port)
        return expand(self.endpoint, ctx, file=self.file_label, field="endpoint").rstrip("/")
