"""The service-manager contract for ``manager: process``: through a local shell, and over
SSH to the test sshd (``loopback``; skipped where no sshd can run)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from manager_contract import ManagerContract, Rig
from managers_support import kill_groups, pidfile_pids

from autotune.launch.base import Launcher
from autotune.launch.managed import ManagedLauncher
from autotune.remote.managers import ProcessManager
from autotune.remote.shell import LocalShell, Shell
from autotune.remote.ssh import HostPool


class ProcessRig(Rig):
    fail_fast_s = 5.0  # the host side is checked once a second

    def __init__(self, tmp_path: Path, shell: Shell) -> None:
        super().__init__(tmp_path)
        self.shell = shell
        self.run_dir = tmp_path / "run"

    def placement(self, name: str) -> dict[str, object]:
        return {"manager": "process"}

    def _new_launcher(self) -> Launcher:
        manager = ProcessManager(
            shell=self.shell,
            deployment="contract",
            run_dir=str(self.run_dir),
            port_wait_s=2.0,
            stop_grace_s=2.0,
        )
        return ManagedLauncher(lambda spec: manager, stop_grace_s=2.0, poll_interval_s=0.05)

    def cleanup(self) -> None:
        try:
            super().cleanup()
        finally:
            kill_groups(pidfile_pids(self.run_dir))


class SSHProcessRig(ProcessRig):
    # Each check of the host side is an SSH round trip: on a machine whose two cores are busy
    # with other work, a start that fails fast took 5-8 s (a clean-clone run beside two
    # benchmarks). Still half the 30 s readiness timeout the tests tell it apart from.
    fail_fast_s = 15.0


class TestProcessManagerLocalShell(ManagerContract):
    @pytest.fixture
    def rig(self, tmp_path: Path) -> Iterator[Rig]:
        rig = ProcessRig(tmp_path, LocalShell())
        yield rig
        rig.cleanup()


class TestProcessManagerOverSSH(ManagerContract):
    @pytest.fixture
    def rig(self, tmp_path: Path, host_pool: HostPool) -> Iterator[Rig]:
        rig = SSHProcessRig(tmp_path, host_pool.get("loopback"))
        yield rig
        rig.cleanup()


def test_the_process_rig_runs_through_a_process_manager_on_its_shell(tmp_path: Path) -> None:
    """What the contract above exercises is the ProcessManager over the given shell."""
    shell = LocalShell()
    launcher = ProcessRig(tmp_path, shell)._new_launcher()
    assert isinstance(launcher, ManagedLauncher)
    manager = launcher.manager_for(None)  # type: ignore[arg-type]
    assert isinstance(manager, ProcessManager) and manager.shell is shell
