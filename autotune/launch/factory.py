"""Which service managers a deployment's launcher uses: this machine's, or hosts' over SSH."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from autotune.launch.base import Launcher
from autotune.launch.local import LocalLauncher
from autotune.specs import ServiceSpec

if TYPE_CHECKING:
    from autotune.deployment import Deployment
    from autotune.remote.managers import ServiceManager

DEFAULT_UNIT_DIR = "/etc/systemd/system"


def make_launcher(
    deployment: Deployment, *, run_dir: Path, accept_new_host_keys: bool = False
) -> Launcher:
    """A :class:`LocalLauncher` when every service is ``manager: local``; otherwise the same
    launcher over a ``process`` or ``systemd`` manager per (host, kind), with one SSH
    connection per host. In such a deployment the services without ``on`` (the router)
    run on this machine as detached processes through a local shell, like the hosts'
    ones: a crash of the tuner leaves them recorded where ``autotune restore`` looks."""
    if all(s.resolved_manager() == "local" for s in deployment.services.values()):
        return LocalLauncher(run_dir=run_dir)
    from autotune.launch.managed import ManagedLauncher
    from autotune.remote.managers import create_manager
    from autotune.remote.shell import LocalShell, Shell
    from autotune.remote.ssh import HostPool

    hosts = dict(deployment.hosts)
    if accept_new_host_keys:
        hosts = {n: h.model_copy(update={"accept_new_host_key": True}) for n, h in hosts.items()}
    pool = HostPool(hosts)
    local = LocalShell()
    unit_dirs = {name: h.systemd_unit_dir for name, h in hosts.items()}
    # Pidfiles, logs and undo records: BASE/DEPLOYMENT on each host; this machine's
    # services (the router) keep theirs in the study's run directory.
    run_dirs: dict[str | None, str] = {
        None: str(run_dir / "services"),
        **{name: f"{h.run_dir.rstrip('/')}/{deployment.name}" for name, h in hosts.items()},
    }
    managers: dict[tuple[str | None, str], ServiceManager] = {}

    def shell(name: str | None) -> Shell:
        return local if name is None else pool.get(name)

    def manager(spec: ServiceSpec) -> ServiceManager:
        kind: Literal["process", "systemd"] = "systemd" if spec.manager == "systemd" else "process"
        key = (spec.on, kind)
        if key not in managers:
            managers[key] = create_manager(
                kind,
                shell=shell(spec.on),
                deployment=deployment.name,
                run_dir=run_dirs.get(spec.on),
                unit_dir=unit_dirs.get(spec.on or "", DEFAULT_UNIT_DIR),
            )
        return managers[key]

    return ManagedLauncher(manager)
