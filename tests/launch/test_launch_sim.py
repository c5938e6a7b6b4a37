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


def _generated(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10.0, trust_env=False).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("sglang:generation_tokens_total")
    )


def test_two_node_deployment_routes_by_the_policy_lever(tmp_path: Path) -> None:
    """Two prefill and two decode workers behind the real router: the replicas run the
    levers of their role, the policy lever reaches the router's command, and the router's
    round_robin (its own code) gives both decode workers half of the requests; changing
    only the policy restarts only the router."""
    from autotune.space import load_space

    root = Path(__file__).resolve().parents[2]
    space = load_space(root / "search_spaces" / "dsv4-flash-rtx6000-pd-2node.yaml")
    dep = load_deployment(root / "launchers" / "sim-dsv4-flash-pd-2node.yaml")
    base = dict(space.baseline_params())
    fast = {**base, "speculative": "off", "max_running_requests": 32}
    config = space.complete({**fast, "router_decode_policy": "round_robin"})
    specs = render(space, dep, config, run_dir=tmp_path)
    assert specs["decode-b"].settings_of == "decode"
    for flag in ("--max-running-requests", "--mem-fraction-static"):
        a, b = (list(specs[n].argv) for n in ("decode", "decode-b"))
        assert a[a.index(flag) + 1] == b[b.index(flag) + 1], flag
    router = list(specs["router"].argv)
    assert router[router.index("--decode-policy") + 1] == "round_robin"
    assert router.count("--prefill") == 2 and router.count("--decode") == 2
    assert "--mem-fraction-static" not in router  # worker levers stay on the workers
    with LocalLauncher(tmp_path, stop_grace_s=5.0) as lau:
        lau.apply(specs)
        url = dep.endpoint_url(specs, run_dir=tmp_path)
        ready = httpx.get(f"{url}/readiness", timeout=5.0, trust_env=False).json()
        assert ready["healthy_workers"] == 4, ready
        decodes = {n: f"http://{specs[n].host}:{specs[n].port}" for n in ("decode", "decode-b")}
        for _ in range(8):
            assert _complete(url).status_code == 200
        made = {n: _generated(u) for n, u in decodes.items()}
        assert made["decode"] == made["decode-b"] == 4 * 3, made  # 8 requests, 3 tokens each
        other = space.complete({**fast, "router_decode_policy": "random"})
        again = lau.apply(render(space, dep, other, run_dir=tmp_path))
        assert again.restarted == ["router"], again
