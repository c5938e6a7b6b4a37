"""probe_text: one greedy non-streaming request."""

from __future__ import annotations

import pytest
from fake_openai_server import MODEL, FakeServer, probe_answer

from autotune.errors import BenchError
from autotune.loadgen import probe_text


def test_completions_text_and_request_shape(fake_server: FakeServer) -> None:
    text = probe_text(fake_server.url, prompt="Why is the sky blue?", max_tokens=4)
    assert text == probe_answer("Why is the sky blue?", 4)
    p = fake_server.payloads[0]
    assert p["temperature"] == 0 and p["stream"] is False and p["model"] == MODEL
    assert fake_server.model_requests == 1


def test_chat_with_explicit_model(fake_server: FakeServer) -> None:
    text = probe_text(fake_server.url + "/v1", prompt="hi", max_tokens=3, model="m", api="chat")
    assert text == probe_answer("hi", 3)
    assert fake_server.payloads[0]["messages"][0]["content"] == "hi"
    assert fake_server.model_requests == 0


@pytest.mark.parametrize(
    ("mode", "message"),
    [("http_error", "HTTP 503"), ("error_event", "server error: boom"), ("hang", "timed out")],
)
def test_failures_raise_bench_error(fake_server: FakeServer, mode: str, message: str) -> None:
    fake_server.behaviour.mode = mode
    with pytest.raises(BenchError, match=message):
        probe_text(fake_server.url, prompt="x", max_tokens=2, model="m", timeout_s=0.5)


def test_unreachable(dead_url: str) -> None:
    with pytest.raises(BenchError, match=f"cannot connect to {dead_url}"):
        probe_text(dead_url, prompt="x", max_tokens=2)
