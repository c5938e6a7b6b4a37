"""Prefill server + decode server + router, end to end over real HTTP."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from autotune.sim import perf_model as pm
from autotune.sim import text
from autotune.sim.levers import config_from_levers

from .conftest import FAST_LEVERS, Launcher, closed_loop

NO_NOISE = {"AUTOTUNE_SIM_NOISE": "0"}


@pytest.fixture(scope="module")
def pd(launcher: Launcher) -> dict[str, object]:
    pre, pre_url = launcher.server(FAST_LEVERS, mode="prefill", env=NO_NOISE, name="prefill")
    dec, dec_url = launcher.server(FAST_LEVERS, mode="decode", env=NO_NOISE, name="decode")
    pre.wait_ready(pre_url)
    dec.wait_ready(dec_url)
    router, url = launcher.router(pre_url, dec_url)
    router.wait_ready(url)
    return {"url": url, "prefill": pre_url, "decode": dec_url, "decode_proc": dec}


def test_streaming_through_the_router(pd: dict[str, object]) -> None:
    url = str(pd["url"])
    body = {
        "prompt": "route me please",
        "max_tokens": 9,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    r = httpx.post(url + "/v1/completions", json=body, timeout=20)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.text.endswith("data: [DONE]\n\n")
    chunks = [json.loads(e[6:]) for e in r.text.split("\n\n")[:-2]]
    assert chunks[-1]["usage"]["completion_tokens"] == 9
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == text.greedy_text(
        "route me please", 9
    )
    prefill_metrics = httpx.get(str(pd["prefill"]) + "/metrics").text
    assert 'sglang:prompt_tokens_total{model_name="deepseek-ai/DeepSeek-V4-Flash"} 3' in (
        prefill_metrics
    )


def test_non_streaming_and_chat_through_the_router(pd: dict[str, object]) -> None:
    url = str(pd["url"])
    out = httpx.post(
        url + "/v1/completions",
        json={"prompt": "x y", "max_tokens": 4, "ignore_eos": True},
        timeout=20,
    ).json()
    assert out["usage"]["completion_tokens"] == 4
    chat = httpx.post(
        url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "ignore_eos": True},
        timeout=20,
    ).json()
    assert chat["object"] == "chat.completion" and chat["usage"]["completion_tokens"] == 2
    assert httpx.get(url + "/v1/models").json()["data"][0]["id"]
    assert httpx.get(url + "/health").status_code == 200
    metrics = httpx.get(url + "/metrics").text
    assert "sgl_router_requests_total" in metrics


def test_pd_throughput_matches_the_model(pd: dict[str, object]) -> None:
    cfg = config_from_levers(FAST_LEVERS)
    expected = pm.expected_output_throughput(cfg, concurrency=16, input_len=64, output_len=64)
    got = closed_loop(str(pd["url"]), concurrency=16, requests=64, input_len=64, output_len=64)
    assert got["tokens"] == 64 * 64
    # the closed form is a steady state: compare after the start-up ramp through prefill
    assert got["steady_throughput"] == pytest.approx(expected, rel=0.10)
    assert got["output_throughput"] < got["steady_throughput"]


def test_router_reports_a_dead_worker(pd: dict[str, object]) -> None:
    url = str(pd["url"])
    pd["decode_proc"].stop()  # type: ignore[attr-defined]
    assert httpx.get(url + "/health", timeout=10).status_code == 503
    r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10)
    assert r.status_code == 502 and r.json()["object"] == "error"


def test_router_argument_errors() -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "autotune.sim.router",
            "--pd-disaggregation",
            "--decode",
            "http://127.0.0.1:1",
        ],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert r.returncode == 2 and "--prefill" in r.stderr
