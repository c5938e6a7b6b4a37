"""Service managers: run one deployment's services on a host.

:class:`LocalManager` runs child processes of the tuner on this machine (``manager:
local``); through a :class:`Shell`, :class:`ProcessManager` runs detached process groups
with a pidfile and :class:`SystemdManager` overrides existing systemd units with a
drop-in. Each keeps what it needs to undo its work where it runs (``run_dir``), so a later
session stops leftovers and ``autotune restore`` works after a crash of the tuner. The
lifecycle around them is the launcher's (:mod:`autotune.launch.managed`).
"""

from __future__ import annotations

from typing import Literal

from autotune.errors import ConfigError
from autotune.remote.managers.base import ServiceManager, ShellManager
from autotune.remote.managers.local import LocalManager
from autotune.remote.managers.process import ProcessManager
from autotune.remote.managers.systemd import SystemdManager
from autotune.remote.shell import Shell

__all__ = [
    "LocalManager",
    "ProcessManager",
    "ServiceManager",
    "ShellManager",
    "SystemdManager",
    "create_manager",
]


def create_manager(
    kind: Literal["process", "systemd"],
    *,
    shell: Shell,
    deployment: str,
    run_dir: str | None = None,
    unit_dir: str = "/etc/systemd/system",
    sudo: bool = True,
) -> ShellManager:
    """The manager for a :attr:`ServiceSpec.manager` value other than ``local`` (a
    :class:`LocalManager` needs no shell; ``unit_dir`` and ``sudo`` apply to systemd only)."""
    if kind == "process":
        return ProcessManager(shell=shell, deployment=deployment, run_dir=run_dir)
    if kind == "systemd":
        return SystemdManager(
            shell=shell, deployment=deployment, run_dir=run_dir, unit_dir=unit_dir, sudo=sudo
        )
    raise ConfigError(
        f"no remote service manager '{kind}'", field="manager", allowed=["process", "systemd"]
    )
