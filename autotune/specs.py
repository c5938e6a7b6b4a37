"""Rendered service specifications: the only thing a launcher receives.

A :class:`ServiceSpec` is fully resolved (no templates, no search-space knowledge): the
argv, the environment to add, the variables to remove, where the service answers and where
it logs. Launchers compare :meth:`ServiceSpec.fingerprint` values to restart only what
changed.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ServiceSpec(BaseModel):
    """One service of a deployment, rendered for one trial."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    argv: tuple[str, ...]
    env: dict[str, str] = Field(default_factory=dict)
    unset_env: tuple[str, ...] = ()
    scratch_env: tuple[str, ...] = ()
    """Variables the manager sets to a directory of this service's own, emptied before each
    start and removed after a stop (the engine's files it never cleans up: vLLM's sockets).
    Not in the fingerprint: where the files go does not change what the service does."""
    host: str = "127.0.0.1"
    port: int
    health_url: str
    ready_timeout_s: float = 600.0
    log_file: str
    workdir: str | None = None
    depends_on: tuple[str, ...] = ()
    info_url: str | None = None
    """``/server_info`` (or ``/get_server_info``) URL read after readiness, if any."""
    metrics_url: str | None = None
    """Prometheus URL scraped around the measured phase (never part of the fingerprint)."""
    on: str | None = None
    """Name of the SSH host (deployment ``hosts:``) that runs the service; None = this machine."""
    manager: Literal["local", "process", "systemd"] = "local"
    """How the service is run: a child process of the tuner (local), a detached process on a
    host (process), or a systemd unit with an autotune drop-in (systemd)."""
    unit: str | None = None
    """systemd unit name (manager ``systemd``), e.g. ``sglang-decode.service``."""
    role: str | None = None
    """The search-space service whose settings this one carries (a second decode worker:
    ``decode``); None: its own name."""

    @property
    def settings_of(self) -> str:
        """The name the search space knows this service by (its role, else its name)."""
        return self.role or self.name

    def fingerprint(self) -> str:
        """Hash of everything that changes what the process does (not where it logs)."""
        payload = {
            "argv": list(self.argv),
            "env": dict(sorted(self.env.items())),
            "unset_env": sorted(self.unset_env),
            "workdir": self.workdir,
            "on": self.on,
            "unit": self.unit,
            "host": self.host,
            "port": self.port,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def command_line(self) -> str:
        """A shell line a person can paste: ``env -u X A=1 prog --flag v``."""
        parts: list[str] = []
        if self.env or self.unset_env:
            parts.append("env")
            for name in sorted(self.unset_env):
                parts += ["-u", name]
            parts += [f"{k}={v}" for k, v in sorted(self.env.items())]
        parts += list(self.argv)
        return shlex.join(parts)


def scratch_name(where: str, service: str) -> str:
    """The name of ``service``'s scratch directory (:attr:`ServiceSpec.scratch_env`) in its
    host's temp directory (or systemd's runtime directory): short, since engines put Unix
    sockets in it (107 bytes a path), and the same at every start of that service from
    ``where`` (its manager's run directory, or its unit), so a start after a crash empties
    what the last one left."""
    digest = hashlib.sha256(f"{where}\0{service}".encode()).hexdigest()[:12]
    return f"autotune-{digest}"
