"""The bundled simulated deployment started by LocalLauncher (skipped until autotune.sim exists)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from autotune.deployment import load_deployment
from autotune.launch import LocalLauncher
from autotune.render import render

pytest.importorskip("autotune.sim.server")
pytest.importorskip("autotune.sim.router")


def test_sim_deployment_starts_health_gated_and_keeps(tmp_path: Path) -> None:
    dep = load_deployment("sim-dsv4-flash-pd")
    specs = render(None, dep, {}, run_dir=tmp_path)
    with LocalLauncher(tmp_path, stop_grace_s=5.0) as lau:
        first = lau.apply(specs)
        assert first.restarted == ["prefill", "decode", "router"]
        url = dep.endpoint_url(specs, run_dir=tmp_path)
        assert httpx.get(f"{url}/health", timeout=5.0, trust_env=False).status_code == 200
        again = lau.apply(specs)
        assert again.restarted == [] and again.kept == ["prefill", "decode", "router"]
    assert not (tmp_path / "state.json").exists()
