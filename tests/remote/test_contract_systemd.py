"""The service-manager contract for ``manager: systemd``, against the stand-in
``systemctl``/``journalctl`` (tests/remote/fake_systemd), which really runs the unit with
autotune's drop-in."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from manager_contract import PY, ManagerContract, Rig
from managers_support import FakeSystemd

from autotune.launch.base import Launcher
from autotune.launch.managed import ManagedLauncher
from autotune.remote.managers import SystemdManager


class SystemdRig(Rig):
    fail_fast_s = 5.0  # the host side is checked once a second
    scratch_is_the_managers = False

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        self.fake = FakeSystemd(tmp_path)
        self.units: set[str] = set()

    def placement(self, name: str) -> dict[str, object]:
        unit = f"contract-{name}.service"
        if unit not in self.units:  # the user's own unit, which autotune overrides
            self.fake.write_unit(unit, [PY, "-c", "import time; time.sleep(300)"])
            assert self.fake.systemctl("daemon-reload").returncode == 0
            self.units.add(unit)
        return {"manager": "systemd", "unit": unit}

    def _new_launcher(self) -> Launcher:
        manager = SystemdManager(
            shell=self.fake.shell,
            deployment="contract",
            run_dir=str(self.tmp_path / "run"),
            unit_dir=str(self.fake.unit_dir),
            sudo=False,
            port_wait_s=2.0,
            stop_grace_s=2.0,
        )
        return ManagedLauncher(lambda spec: manager, stop_grace_s=2.0, poll_interval_s=0.05)

    def cleanup(self) -> None:
        try:
            super().cleanup()
        finally:
            self.fake.cleanup()


class TestSystemdManager(ManagerContract):
    @pytest.fixture
    def rig(self, tmp_path: Path) -> Iterator[Rig]:
        rig = SystemdRig(tmp_path)
        yield rig
        rig.cleanup()
