"""Which launcher a deployment needs: local child processes, or managers on hosts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from autotune.launch.base import Launcher
from autotune.launch.local import LocalLauncher

if TYPE_CHECKING:
    from autotune.deployment import Deployment


def make_launcher(
    deployment: Deployment, *, run_dir: Path, accept_new_host_keys: bool = False
) -> Launcher:
    """A :class:`LocalLauncher` when every service is ``manager: local``; otherwise a
    :class:`~autotune.launch.remote.RemoteLauncher` with one SSH connection per host
    (services without ``on`` run on this machine through a local shell)."""
    if all(s.resolved_manager() == "local" for s in deployment.services.values()):
        return LocalLauncher(run_dir=run_dir)
    from autotune.launch.remote import RemoteLauncher
    from autotune.remote.shell import LocalShell, Shell
    from autotune.remote.ssh import HostPool

    hosts = dict(deployment.hosts)
    if accept_new_host_keys:
        hosts = {n: h.model_copy(update={"accept_new_host_key": True}) for n, h in hosts.items()}
    pool = HostPool(hosts)
    local = LocalShell()

    def shells(name: str | None) -> Shell:
        return local if name is None else pool.get(name)

    return RemoteLauncher(
        shells=shells,
        deployment=deployment.name,
        unit_dirs={name: h.systemd_unit_dir for name, h in hosts.items()},
        # Pidfiles, logs and undo records: BASE/DEPLOYMENT on each host; this machine's
        # services (the router) keep theirs in the study's run directory.
        run_dirs={
            None: str(run_dir / "services"),
            **{name: f"{h.run_dir.rstrip('/')}/{deployment.name}" for name, h in hosts.items()},
        },
    )
