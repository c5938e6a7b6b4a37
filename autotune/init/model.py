"""What ``autotune init`` read: each service as it runs today, before anything is written.

Every source (a command line, a systemd unit, a compose service, a Kubernetes container) gives
a :class:`RawService`: the argv and environment exactly as the source spells them, plus what
the source itself says about the service (its unit and host, its health probe, its GPUs).
Reading that argv with the engine's own parser (:mod:`autotune.init.options`) turns it into an
:class:`ImportedService`, whose :meth:`ImportedService.argv` gives the command back token for
token: the baseline the space writes is exactly what runs now.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from autotune.engines import BaseEngine, OptionInfo
from autotune.hosts import HostSpec

Typed = bool | int | float | str | list[str] | None
"""A value as the engine's parser would type it: a switch is a bool, ``--port 8000`` an int,
``nargs='+'`` a list; ``None`` for a flag without a value."""


@dataclass(frozen=True)
class SecretNote:
    """A credential found in a service: never written, always a reference."""

    service: str
    what: str
    """``environment variable HF_TOKEN`` or ``value of --api-key``."""
    var: str
    """The variable that carries it when the services run."""
    left_to_unit: bool = False
    """The unit keeps providing it (its own ``Environment=``/``EnvironmentFile=`` still
    apply under autotune's drop-in), so the deployment does not mention it at all."""
    origin: str = ""

    def __str__(self) -> str:
        if self.left_to_unit:
            return (
                f"secret: {self.what} of service {self.service} is left to its systemd unit"
                f"{' (' + self.origin + ')' if self.origin else ''}: not written anywhere"
            )
        origin = f" (it came from {self.origin})" if self.origin else ""
        return (
            f"secret: {self.what} of service {self.service} written as ${{env:{self.var}}}"
            f"{origin}: export {self.var} in the shell that runs `autotune run`"
        )


@dataclass
class RawService:
    """One service as its source spells it."""

    origin: str
    """Where it came from, for messages: ``--from-command #1``, ``systemd unit x on gpu-a``."""
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    name_hint: str | None = None
    """The source's own name for it (a compose service, a unit, a k8s label)."""
    network_name: str | None = None
    """How the other containers reach it (a compose service name, a Kubernetes Service
    name): URLs of other services naming it become where autotune runs it."""
    env_origin: dict[str, str] = field(default_factory=dict)
    """Variables that came from somewhere other than the command itself (an
    ``EnvironmentFile=``, a Kubernetes Secret): name -> where."""
    env_refs: set[str] = field(default_factory=set)
    """Variables whose value is already a reference the deployment resolves at run time
    (a Kubernetes ``secretKeyRef``, a compose ``${VAR}``): their value is ``${env:VAR}``."""
    workdir: str | None = None
    host: tuple[str, HostSpec] | None = None
    """The SSH host that runs it (``--from-systemd HOST:UNIT``): its name and settings."""
    jump_hosts: dict[str, HostSpec] = field(default_factory=dict)
    """The hosts that ``host`` is reached through (``jump:``), by name."""
    manager: Literal["local", "systemd"] = "local"
    unit: str | None = None
    unit_dir: str | None = None
    """Where the unit's file lives on its host (drop-ins go below it)."""
    health_path: str | None = None
    """The source's own readiness probe (a k8s ``readinessProbe``, a compose healthcheck)."""
    gpus: int | None = None
    """GPUs the source reserves for it (k8s ``nvidia.com/gpu``, compose devices)."""
    container_port: int | None = None
    depends_on: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    """``autotune.io/study`` / ``trial`` / ``service`` of an exported winner."""


@dataclass
class ParsedOption:
    """One option of a command, read with the engine's parser."""

    flag: str
    """The spelling that stays in the command (the canonical long name)."""
    values: list[str]
    eq: bool = False
    """Written ``--flag=value``."""
    info: OptionInfo | None = None
    """What the engine's parser declares (``None``: the generic engine, unchecked)."""
    value: Typed = None

    def tokens(self) -> list[str]:
        if self.eq and self.values:
            return [f"{self.flag}={self.values[0]}", *self.values[1:]]
        return [self.flag, *self.values]

    @property
    def text(self) -> str:
        """The value as written (several values joined by a space)."""
        return " ".join(self.values)


@dataclass
class ImportedService:
    """A service read through its engine: typed options, environment, where it answers."""

    name: str
    raw: RawService
    engine: BaseEngine
    wrapper: list[str]
    """argv before the program (``numactl ...``, ``taskset ...``), never edited."""
    head: list[str]
    """The program and its positional arguments (``vllm serve MODEL``)."""
    options: list[ParsedOption]
    env: dict[str, str]
    program_len: int = 1
    """How many words of ``head`` are the program (the rest are positionals)."""
    typed_env: dict[str, Typed] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 0
    health_path: str = "/health"
    info_path: str | None = None
    metrics_path: str | None = None
    role: str = "server"
    """What it does in the deployment: server, prefill, decode or router."""
    platform: Literal["cpu", "gpu"] = "gpu"
    depends_on: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def argv(self) -> list[str]:
        """The command, token for token (wrapper, program, options)."""
        out = [*self.wrapper, *self.head]
        for option in self.options:
            out += option.tokens()
        return out

    def option(self, flag: str) -> ParsedOption | None:
        """The first occurrence of ``flag`` (any of its spellings)."""
        for option in self.options:
            if option.flag == flag or (option.info is not None and flag in option.info.flags):
                return option
        return None

    def count(self, flag: str) -> int:
        return sum(
            1
            for o in self.options
            if o.flag == flag or (o.info is not None and flag in o.info.flags)
        )

    @property
    def gpu_count(self) -> int | None:
        """GPUs it uses: ``CUDA_VISIBLE_DEVICES``, else what its source reserves."""
        visible = self.env.get("CUDA_VISIBLE_DEVICES")
        if visible is not None and visible.strip() and "${" not in visible:
            return len([d for d in visible.split(",") if d.strip()])
        return self.raw.gpus

    @property
    def model(self) -> str | None:
        """The model it serves, as the command names it (for the recipes and ``model:``)."""
        for flag in ("--served-model-name", "--model-path", "--model"):
            option = self.option(flag)
            if option is not None and option.values:
                return option.values[0]
        positional = self.head[self.program_len :]
        return positional[0] if positional else None

    def model_path(self) -> str | None:
        """The checkpoint it loads (not its served name): what the recipes match."""
        for flag in ("--model-path", "--model"):
            option = self.option(flag)
            if option is not None and option.values:
                return option.values[0]
        positional = self.head[self.program_len :]
        return positional[0] if positional else None
