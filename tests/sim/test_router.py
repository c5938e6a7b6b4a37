"""Prefill server + decode server behind the real SGLang PD router, over real HTTP.

The router (PyPI ``sglang-router``) sends each request to prefill and decode at the same
time with ``bootstrap_host``/``bootstrap_port``/``bootstrap_room``; the decode waits for the
room's KV from the prefill's bootstrap server, then decodes and streams.
"""

from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import pytest

from autotune.sim import perf_model as pm
from autotune.sim import text
from autotune.sim.levers import config_from_levers

from .conftest import FAST_LEVERS, Launcher, closed_loop, free_port

NO_NOISE = {"AUTOTUNE_SIM_NOISE": "0"}
MODEL = "deepseek-ai/DeepSeek-V4-Flash"
WAITING_TIMEOUT_S = 2.0
NO_ROOM = "Invalid request: Disaggregated request received without bootstrap room id. req.rid="


@pytest.fixture(scope="module")
def pd(launcher: Launcher) -> dict[str, object]:
    pre, pre_url = launcher.server(
        FAST_LEVERS, mode="prefill", env=NO_NOISE, name="prefill", direct=False
    )
    dec, dec_url = launcher.server(
        FAST_LEVERS,
        mode="decode",
        env={**NO_NOISE, "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": str(WAITING_TIMEOUT_S)},
        name="decode",
        direct=False,
    )
    pre.wait_ready(pre_url)
    dec.wait_ready(dec_url)
    router, url = launcher.router(pre_url, dec_url, pre.bootstrap_port)
    router.wait_ready(url, path="/readiness")
    return {
        "url": url,
        "prefill": pre_url,
        "decode": dec_url,
        "bootstrap": pre.bootstrap_port,
        "prefill_proc": pre,
        "decode_proc": dec,
        "router_proc": router,
    }


def events(body: str) -> list[dict[str, object]]:
    assert body.endswith("data: [DONE]\n\n"), body
    return [json.loads(e[6:]) for e in body.split("\n\n")[:-2]]


def test_streaming_through_the_router(pd: dict[str, object]) -> None:
    url = str(pd["url"])
    body = {
        "model": MODEL,
        "prompt": "route me please",
        "max_tokens": 9,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    r = httpx.post(url + "/v1/completions", json=body, timeout=20)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    chunks = events(r.text)
    assert chunks[-1]["usage"]["completion_tokens"] == 9  # type: ignore[index]
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == text.greedy_text(  # type: ignore[index]
        "route me please", 9
    )
    # the prefill did the prompt's forward (the router sent it the same request)
    prefill_metrics = httpx.get(str(pd["prefill"]) + "/metrics").text
    labels = f'engine_type="prefill",is_streaming="true",model_name="{MODEL}"'
    assert f"sglang:prompt_tokens_total{{{labels}}} 3.0" in prefill_metrics


def test_non_streaming_chat_models_and_readiness(pd: dict[str, object]) -> None:
    url = str(pd["url"])
    out = httpx.post(
        url + "/v1/completions",
        json={"model": MODEL, "prompt": "x y", "max_tokens": 4, "ignore_eos": True},
        timeout=20,
    ).json()
    assert out["usage"]["completion_tokens"] == 4
    assert out["choices"][0]["text"] == text.greedy_text("x y", 4)
    chat = httpx.post(
        url + "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
            "ignore_eos": True,
        },
        timeout=20,
    ).json()
    assert chat["object"] == "chat.completion" and chat["usage"]["completion_tokens"] == 2
    # /v1/models from the router's worker registry (the workers' /model_info)
    assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == MODEL
    ready = httpx.get(url + "/readiness")
    assert ready.status_code == 200 and ready.json()["healthy_workers"] == 2


def test_the_router_refuses_token_id_prompts(pd: dict[str, object]) -> None:
    """sglang-router 0.3.2 parses /v1/completions' prompt as a string or a list of strings:
    token ids are refused before any worker sees them (so the bundled study sends text)."""
    body = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2}
    r = httpx.post(str(pd["url"]) + "/v1/completions", json=body, timeout=10)
    assert r.status_code == 422 and "StringOrArray" in r.text


def test_ttft_includes_the_prefill(pd: dict[str, object]) -> None:
    """A long prompt: the first token through the router comes after the prefill's forward
    (the decode waits for the room's KV), so TTFT >= the modeled prefill time."""
    n = 6000
    prefill_s = pm.prefill_seconds(config_from_levers(FAST_LEVERS, mode="prefill"), n)
    step_s = pm.decode_step_seconds(config_from_levers(FAST_LEVERS, mode="decode"), 1)
    assert prefill_s > 5 * step_s  # the test means something
    body = {
        "model": MODEL,
        "prompt": " ".join(["word"] * n),
        "max_tokens": 4,
        "ignore_eos": True,
        "stream": True,
    }
    t0 = time.monotonic()
    first = 0.0
    with httpx.stream("POST", str(pd["url"]) + "/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {") and '"text": "' in line and not first:
                first = time.monotonic() - t0
    assert first >= 0.95 * prefill_s
    assert first < prefill_s + 10 * step_s + 0.5


def _router_ttft(url: str, prompt: str) -> float:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "ignore_eos": True, "stream": True}
    t0 = time.monotonic()
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {") and '"text": "' in line:
                return time.monotonic() - t0
    raise AssertionError("no token")


def test_the_prefill_radix_cache_shortens_a_repeated_prompt(pd: dict[str, object]) -> None:
    """The prefill server keeps a radix cache (SGLang's does; the decode's is off): the same
    long prompt again through the router computes only its last page, and the decode counts
    the prefill's cached tokens (disaggregation/decode.py takes them from the hand-over)."""
    n = 8000
    prompt = " ".join(text.VOCAB[i * 13 % len(text.VOCAB)] for i in range(n))
    first = _router_ttft(str(pd["url"]), prompt)
    second = _router_ttft(str(pd["url"]), prompt)
    assert second < first / 3, (first, second)
    metrics = httpx.get(str(pd["decode"]) + "/metrics").text
    labels = f'cache_source="device",engine_type="decode",model_name="{MODEL}"'
    series = f"sglang:cached_tokens_total{{{labels}}}"
    (line,) = [ln for ln in metrics.splitlines() if ln.startswith(series)]
    assert float(line.split()[-1]) >= (n - 1) // 256 * 256


def test_pd_throughput_matches_the_model(pd: dict[str, object]) -> None:
    cfg = config_from_levers(FAST_LEVERS)
    expected = pm.expected_output_throughput(cfg, concurrency=16, input_len=64, output_len=64)
    # The closed form is a steady state: compare after the start-up ramp through prefill.
    # Contention can only slow a run (one read 675 against 1,054 beside the suite on 2 busy
    # cores), so up to three runs: none may beat the model by more than 10%, and the best
    # must come within 10% of it.
    runs = []
    for _ in range(3):
        got = closed_loop(str(pd["url"]), concurrency=16, requests=64, input_len=64, output_len=64)
        assert got["tokens"] == 64 * 64
        assert got["output_throughput"] < got["steady_throughput"]
        assert got["steady_throughput"] < expected * 1.10, (got, expected)
        runs.append(got["steady_throughput"])
        if got["steady_throughput"] > expected * 0.90:
            break
    assert max(runs) == pytest.approx(expected, rel=0.10), (runs, expected)


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_request_without_a_room_is_refused(pd: dict[str, object], role: str) -> None:
    """SGLang's scheduler (srt/managers/scheduler.py) aborts it with HTTP 400; a stream gets
    HTTP 200 with the error as an event (srt/entrypoints/openai/serving_completions.py)."""
    url = str(pd[role])
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
    r = httpx.post(url + "/v1/completions", json=body, timeout=10)
    assert r.status_code == 400
    err = r.json()
    assert err["object"] == "error" and err["type"] == "BadRequestError" and err["code"] == 400
    assert err["message"].startswith(NO_ROOM)
    r = httpx.post(url + "/v1/completions", json={**body, "stream": True}, timeout=10)
    assert r.status_code == 200
    (event,) = events(r.text)
    assert event["error"]["code"] == 400 and event["error"]["type"] == "BAD_REQUEST"  # type: ignore[index]
    assert event["error"]["message"].startswith(NO_ROOM)  # type: ignore[index]
    gen = httpx.post(url + "/generate", json={"text": "x"}, timeout=10)
    assert gen.status_code == 400 and gen.json()["error"]["message"].startswith(NO_ROOM)


def _request(pd: dict[str, object], role: str, room: int, **extra: object) -> httpx.Response:
    """A request as the router sends it to ``role``, for bootstrap room ``room``."""
    body = {
        "model": MODEL,
        "prompt": "wait for me",
        "max_tokens": 3,
        "ignore_eos": True,
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": pd["bootstrap"],
        "bootstrap_room": room,
        **extra,
    }
    return httpx.post(str(pd[role]) + "/v1/completions", json=body, timeout=20)


def test_decode_waits_for_the_rooms_kv(pd: dict[str, object]) -> None:
    room = 1234567
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        t0 = time.monotonic()
        pending = pool.submit(_request, pd, "decode", room)
        time.sleep(0.5)
        assert not pending.done()  # no prefill for the room yet
        pre = _request(pd, "prefill", room)
        r = pending.result(timeout=10)
    assert pre.status_code == 200
    assert pre.json()["choices"][0]["finish_reason"] == "length"
    assert r.status_code == 200 and time.monotonic() - t0 >= 0.5
    assert r.json()["choices"][0]["text"] == text.greedy_text("wait for me", 3)


def test_decode_gives_up_on_a_room_whose_prefill_never_comes(pd: dict[str, object]) -> None:
    t0 = time.monotonic()
    r = _request(pd, "decode", 7654321)
    took = time.monotonic() - t0
    assert WAITING_TIMEOUT_S <= took < WAITING_TIMEOUT_S + 2.0
    assert r.status_code == 500
    message = r.json()["message"]
    assert message.startswith("Decode transfer failed for request rank=0")
    assert "Request 7654321 timed out after 2.0s in KVPoll.WaitingForInput" in message
    # a stream: HTTP 200, then the error event
    r = _request(pd, "decode", 7654322, stream=True)
    (event,) = events(r.text)
    assert r.status_code == 200 and event["error"]["code"] == 500  # type: ignore[index]


def test_decode_fails_at_once_when_the_prefill_is_gone(pd: dict[str, object]) -> None:
    t0 = time.monotonic()
    r = _request(pd, "decode", 42, bootstrap_port=free_port())
    assert r.status_code == 500 and time.monotonic() - t0 < 1.5
    assert r.json()["message"].startswith("Decode handshake failed for request rank=0")


def test_router_reports_a_dead_decode(pd: dict[str, object]) -> None:
    url = str(pd["url"])
    pd["decode_proc"].stop()  # type: ignore[attr-defined]
    r = httpx.post(
        url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2}, timeout=10
    )
    assert r.status_code == 502
    err = r.json()["error"]
    assert err["code"] == "decode_server_error" and "Decode server error" in err["message"]


def _accept_length(decode_url: str) -> float:
    info = httpx.get(decode_url + "/server_info", timeout=10).json()
    [state] = info["internal_states"]
    return float(state["avg_spec_accept_length"])


def test_a_speculative_prefill_seeds_the_decode_drafts(launcher: Launcher) -> None:
    """Decode-only speculation (prefill without EAGLE) is its own code path in SGLang: the
    drafts start without the prompt's draft state (disaggregation/nixl/conn.py,
    speculative/eagle_disaggregation.py), so fewer drafts are accepted; the prefill's
    hand-over says which it was. Measured through the real router, one prefill of each."""
    eagle = {**FAST_LEVERS, "speculative": "eagle", "speculative_num_steps": 3}
    runs: dict[bool, float] = {}
    for seeded in (True, False):
        pre, pre_url = launcher.server(
            {**eagle, "prefill_speculative": seeded},
            mode="prefill",
            env=NO_NOISE,
            name=f"prefill-seeded-{seeded}",
            direct=False,
        )
        dec, dec_url = launcher.server(
            eagle, mode="decode", env=NO_NOISE, name=f"decode-seeded-{seeded}", direct=False
        )
        pre.wait_ready(pre_url)
        dec.wait_ready(dec_url)
        router, url = launcher.router(pre_url, dec_url, pre.bootstrap_port)
        router.wait_ready(url, path="/readiness")
        # 48 requests (~1,300 decode steps): one clean-clone run read 2.556 against the
        # model's 2.391 with 24 (six repeats here read 2.355-2.400), a 4-sigma draw.
        closed_loop(url, concurrency=8, requests=48, input_len=64, output_len=64)
        runs[seeded] = _accept_length(dec_url)
        for proc in (router, dec, pre):
            proc.stop()
    cfg = config_from_levers(eagle, mode="decode")
    want = {s: pm.accept_length(cfg, seeded=s) for s in (True, False)}
    assert want[True] > want[False] * 1.08  # control: the model tells them apart
    for seeded, got in runs.items():
        assert got == pytest.approx(want[seeded], rel=0.06), (seeded, runs, want)
    assert runs[True] > runs[False]
