"""The simulated PD router in front of hung workers: its upstream calls time out (502)."""

from __future__ import annotations

import select
import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from fault_fixtures import StartServer, Timer

from autotune.errors import BenchError
from autotune.loadgen import LoadSpec, run_load

ROUTER_TIMEOUT_S = 0.5


@pytest.fixture
def routers() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait(5)
        assert proc.stdout is not None
        proc.stdout.close()


def start_router(procs: list[subprocess.Popen[bytes]], prefill: str, decode: str) -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "autotune.sim.router", "--pd-disaggregation"]
    argv += ["--prefill", prefill, "--decode", decode, "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--request-timeout-secs", str(ROUTER_TIMEOUT_S), "--health-check-timeout-secs", "0.3"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    procs.append(proc)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 15.0)
    line = proc.stdout.readline().decode() if ready else ""
    assert "PD router listening" in line, line
    return f"http://127.0.0.1:{port}"


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
    assert f"{hung} worker {bad.url} failed: timed out" in r.json()["message"]
    assert ROUTER_TIMEOUT_S - 0.05 < t.seconds < ROUTER_TIMEOUT_S + 1.5
    # The router itself stays responsive, and the loader names the 502.
    assert httpx.get(url + "/metrics", timeout=2).status_code == 200
    with pytest.raises(BenchError, match="warm-up request .* failed: HTTP 502: .*timed out"):
        run_load(url, LoadSpec(concurrency=1, requests=1, model="m", request_timeout_s=5))


def test_hung_decode_models_and_health(
    start_server: StartServer, routers: list[subprocess.Popen[bytes]]
) -> None:
    ok = start_server("ok")
    bad = start_server("hang_all")
    url = start_router(routers, ok.url, bad.url)
    with Timer() as t:
        models = httpx.get(url + "/v1/models", timeout=10)
        health = httpx.get(url + "/health", timeout=10)
    assert models.status_code == 502 and "timed out" in models.json()["message"]
    assert health.status_code == 503 and health.json()["down"] == [bad.url]
    assert t.seconds < 2.5
