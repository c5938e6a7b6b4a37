"""Every service of a deployment as a child process of the tuner (one host).

:class:`LocalLauncher` is the one launcher (:class:`~autotune.launch.managed.ManagedLauncher`)
with a single :class:`~autotune.remote.managers.local.LocalManager`: its process groups, log
files and ``RUN_DIR/state.json`` (leftovers of a crashed or killed session are stopped
before the first start, or by ``stop_all`` on a fresh launcher) are described there.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from autotune.failures import FATAL_WHILE_ALIVE, Failure
from autotune.launch.managed import ManagedLauncher
from autotune.remote.managers.local import LocalManager


class LocalLauncher(ManagedLauncher):
    """Runs :class:`~autotune.specs.ServiceSpec` s as local subprocesses.

    ``run_dir`` holds ``state.json``; ``stop_grace_s`` is the SIGTERM-to-SIGKILL grace;
    ``port_wait_s`` bounds the wait for a port still held (by the previous instance, or
    anything else: then the start fails with ``port_in_use``); ``fatal_while_alive`` are
    the log classes that fail a start even though the process has not exited.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        stop_grace_s: float = 10.0,
        port_wait_s: float = 10.0,
        poll_interval_s: float = 0.1,
        probe_timeout_s: float = 2.0,
        fatal_while_alive: Iterable[Failure] = FATAL_WHILE_ALIVE,
    ) -> None:
        self.manager = LocalManager(run_dir, port_wait_s=port_wait_s, stop_grace_s=stop_grace_s)
        super().__init__(
            lambda spec: self.manager,
            known=[self.manager],
            stop_grace_s=stop_grace_s,
            poll_interval_s=poll_interval_s,
            connect_timeout_s=0.5,
            probe_timeout_s=probe_timeout_s,
            fatal_while_alive=frozenset(fatal_while_alive),
        )

    @property
    def run_dir(self) -> Path:
        return self.manager.run_dir

    @property
    def state_file(self) -> Path:
        return self.manager.state_file

    def pids(self) -> dict[str, int]:
        """Process id (= process group id) per running service."""
        return self.manager.pids()
