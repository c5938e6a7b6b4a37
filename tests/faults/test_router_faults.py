"""The real SGLang PD router in front of hung workers: its upstream calls time out (502)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from fault_fixtures import StartServer, Timer

from autotune.errors import BenchError
from autotune.loadgen import LoadSpec, run_load
from autotune.ports import pick_free_port as _free_port

ROUTER_TIMEOUT_S = 1  # whole seconds (the flag is an int)


@pytest.fixture
def routers() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait(5)


def start_router(
    procs: list[subprocess.Popen[bytes]], prefill: str, decode: str, *, ready: bool = True
) -> str:
    """``python -m sglang_router.launch_router --pd-disaggregation`` (sglang-router), with
    the flags of the bundled sim deployment and a short ``--request-timeout-secs``."""
    port = _free_port()
    argv = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    argv += ["--prefill", prefill, "none", "--decode", decode]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warn"]
    argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(_free_port())]
    argv += ["--disable-circuit-breaker", "--disable-retries", "--disable-health-check"]
    argv += ["--worker-startup-check-interval", "1"]
    argv += ["--request-timeout-secs", str(ROUTER_TIMEOUT_S)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(proc)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 15.0
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"router exited {proc.returncode}"
        try:
            r = httpx.get(url + ("/readiness" if ready else "/liveness"), timeout=1.0)
            if r.status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError("the router did not become ready")


BODY = {"model": "m", "prompt": "hi", "max_tokens": 4, "stream": True}


@pytest.mark.parametrize("hung", ["decode", "prefill"])
def test_hung_worker_becomes_502_within_the_router_timeout(
    start_server: StartServer, routers: list[subprocess.Popen[bytes]], hung: str
) -> None:
    ok = start_server("ok")
    bad = start_server("hang")
    prefill, decode = (bad.url, ok.url) if hung == "prefill" else (ok.url, bad.url)
    url = start_router(routers, prefill, decode)
    with Timer() as t:
        r = httpx.post(url + "/v1/completions", json=BODY, timeout=10)
    assert r.status_code == 502
    err = r.json()["error"]
    assert err["type"] == "Bad Gateway" and err["code"] == f"{hung}_server_error"
    assert f"{bad.url}/v1/completions" in err["message"]
    assert ROUTER_TIMEOUT_S - 0.05 < t.seconds < ROUTER_TIMEOUT_S + 1.5
    # The router itself stays responsive, and the loader names the 502.
    assert httpx.get(url + "/readiness", timeout=2).status_code == 200
    # (text prompts: the router refuses token-id prompts on /v1/completions, HTTP 422)
    spec = LoadSpec(concurrency=1, requests=1, model="m", prompt="text", request_timeout_s=5)
    with pytest.raises(BenchError, match="warm-up request .* failed: HTTP 502"):
        run_load(url, spec)


def test_a_worker_hung_at_registration_keeps_the_router_not_ready(
    start_server: StartServer, routers: list[subprocess.Popen[bytes]]
) -> None:
    """A decode that never answers (its /health included) is never registered: /readiness
    stays 503, so the launcher's health gate does not pass a router that cannot route;
    the router's own endpoints stay responsive."""
    ok = start_server("ok")
    bad = start_server("hang_all")
    url = start_router(routers, ok.url, bad.url, ready=False)
    time.sleep(1.0)
    with Timer() as t:
        ready = httpx.get(url + "/readiness", timeout=10)
        live = httpx.get(url + "/liveness", timeout=10)
        models = httpx.get(url + "/v1/models", timeout=10)
    assert ready.status_code == 503 and ready.json()["status"] == "not ready"
    assert live.status_code == 200 and models.status_code == 200
    assert t.seconds < 5.0  # not held by the hung worker (10 s timeouts); room for busy CI
    r = httpx.post(url + "/v1/completions", json=BODY, timeout=10)
    assert r.status_code == 503
