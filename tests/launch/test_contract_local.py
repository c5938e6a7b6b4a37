"""The service-manager contract for ``manager: local`` (child processes of the tuner)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from manager_contract import ManagerContract, Rig

from autotune.launch import LocalLauncher
from autotune.launch.base import Launcher


class LocalRig(Rig):
    fail_fast_s = 2.0

    def _new_launcher(self) -> Launcher:
        return LocalLauncher(
            self.tmp_path / "run", stop_grace_s=2.0, port_wait_s=2.0, poll_interval_s=0.05
        )


class TestLocalManager(ManagerContract):
    @pytest.fixture
    def rig(self, tmp_path: Path) -> Iterator[Rig]:
        rig = LocalRig(tmp_path)
        yield rig
        rig.cleanup()


def test_the_local_launcher_runs_its_services_through_one_local_manager(tmp_path: Path) -> None:
    """What the contract above exercises is the LocalManager, not another path."""
    from autotune.launch.managed import ManagedLauncher
    from autotune.remote.managers.local import LocalManager

    launcher = LocalRig(tmp_path)._new_launcher()
    assert isinstance(launcher, ManagedLauncher)
    assert isinstance(launcher.manager_for(None), LocalManager)  # type: ignore[arg-type]


def test_a_scratch_variable_exported_by_the_user_is_theirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``VLLM_RPC_BASE_PATH`` set in the tuner's shell reaches the service as it is, and no
    scratch directory is made for it."""
    var = "AUTOTUNE_TEST_SCRATCH"
    mine = tmp_path / "mine"
    mine.mkdir()
    monkeypatch.setenv(var, str(mine))
    rig = LocalRig(tmp_path)
    try:
        spec = rig.spec("svc", "--leave-file-in", var, scratch_env=(var,))
        info = rig.launcher().apply({"svc": spec}).info["svc"]
        assert info["scratch"] == str(mine)
        assert [p.name for p in mine.iterdir()] == [f"left-by-{info['pid']}"]
    finally:
        rig.cleanup()
    assert mine.is_dir()  # the user's directory is never removed
