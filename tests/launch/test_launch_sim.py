"""The bundled simulated deployment (sim servers behind the real sglang-router) started by
LocalLauncher."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from autotune.deployment import load_deployment
from autotune.launch import LocalLauncher
from autotune.render import render

pytest.importorskip("autotune.sim.server")
pytest.importorskip("sglang_router")

MODEL = "deepseek-ai/DeepSeek-V4-Flash"


def _complete(url: str) -> httpx.Response:
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 3, "ignore_eos": True}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=30.0, trust_env=False)


def test_sim_deployment_starts_health_gated_and_keeps(tmp_path: Path) -> None:
    dep = load_deployment("sim-dsv4-flash-pd")
    specs = render(None, dep, {}, run_dir=tmp_path)
    assert specs["router"].health_url.endswith("/readiness")  # 200 only once it can route
    with LocalLauncher(tmp_path, stop_grace_s=5.0) as lau:
        first = lau.apply(specs)
        assert first.restarted == ["prefill", "decode", "router"]
        url = dep.endpoint_url(specs, run_dir=tmp_path)
        ready = httpx.get(f"{url}/readiness", timeout=5.0, trust_env=False)
        assert ready.status_code == 200 and ready.json()["healthy_workers"] == 2
        r = _complete(url)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        again = lau.apply(specs)
        assert again.restarted == [] and again.kept == ["prefill", "decode", "router"]
    assert not (tmp_path / "state.json").exists()


def test_two_sim_deployments_run_side_by_side(tmp_path: Path) -> None:
    """Two sessions of the bundled deployment on one machine: each picks its own ports,
    the prefill's bootstrap port and the router's Prometheus port included."""
    deps = [load_deployment("sim-dsv4-flash-pd") for _ in range(2)]
    listeners = [
        {*d.ports().values(), *(p for e in d.extra_ports().values() for p in e.values())}
        for d in deps
    ]
    assert len(listeners[0]) == len(listeners[1]) == 5 and not listeners[0] & listeners[1]
    launchers = [LocalLauncher(tmp_path / f"s{i}", stop_grace_s=5.0) for i in range(2)]
    try:
        for i, (dep, lau) in enumerate(zip(deps, launchers, strict=True)):
            specs = render(None, dep, {}, run_dir=tmp_path / f"s{i}")
            assert lau.apply(specs).restarted == ["prefill", "decode", "router"]
            assert _complete(dep.endpoint_url(specs, run_dir=tmp_path / f"s{i}")).status_code == 200
    finally:
        for lau in launchers:
            lau.close()
