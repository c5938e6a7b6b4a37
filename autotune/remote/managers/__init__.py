"""Service managers: run one deployment's services on a host through a :class:`Shell`.

:class:`ProcessManager` runs detached process groups with a pidfile; :class:`SystemdManager`
overrides existing systemd units with a drop-in. Both keep what they need to undo their work
on the host (``run_dir``), so ``autotune restore`` works after a crash of the tuner.
"""

from __future__ import annotations

from typing import Literal

from autotune.errors import ConfigError
from autotune.remote.managers.base import ServiceManager
from autotune.remote.managers.process import ProcessManager
from autotune.remote.managers.systemd import SystemdManager
from autotune.remote.shell import Shell

__all__ = ["ProcessManager", "ServiceManager", "SystemdManager", "create_manager"]


def create_manager(
    kind: Literal["process", "systemd"],
    *,
    shell: Shell,
    deployment: str,
    run_dir: str | None = None,
    unit_dir: str = "/etc/systemd/system",
    sudo: bool = True,
) -> ServiceManager:
    """The manager for a :attr:`ServiceSpec.manager` value other than ``local``
    (``unit_dir`` and ``sudo`` apply to systemd only)."""
    if kind == "process":
        return ProcessManager(shell=shell, deployment=deployment, run_dir=run_dir)
    if kind == "systemd":
        return SystemdManager(
            shell=shell, deployment=deployment, run_dir=run_dir, unit_dir=unit_dir, sudo=sudo
        )
    raise ConfigError(
        f"no remote service manager '{kind}'", field="manager", allowed=["process", "systemd"]
    )
