"""A small OpenAI-compatible streaming server on 127.0.0.1 for load-generator tests.

It emits a known number of tokens with known delays, in single- or multi-token chunks
(speculative-decoding style), and misbehaves on request: HTTP errors, ``{"error": ...}``
events, malformed JSON, hanging, dropping the connection, no usage, no ``[DONE]``. It counts
requests in flight (decremented before the final event, so a correct closed loop can never
push it above C) and TCP connections, and runs in its own thread and event loop.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

MODEL = "test-model"


@dataclass
class Behaviour:
    """How the fake server answers; ``fail_every=n`` applies ``fail_mode`` to every n-th."""

    mode: str = "ok"  # ok|http_error|error_event|malformed|hang|drop|no_usage|no_done
    ttft_s: float = 0.0
    chunk_delay_s: float = 0.0
    tokens_per_chunk: int = 1
    fail_every: int = 0
    fail_mode: str = "error_event"
    slow_every: int = 0
    slow_extra_ttft_s: float = 0.0
    slow_at: frozenset[int] = frozenset()
    """Requests (0-based, counting from the server's start) that get ``slow_extra_ttft_s``
    once: a transient stall, like a GC pause."""
    crlf: bool = False
    coalesce: bool = False
    """Write all events of a request in one network write."""
    models_status: int = 200
    delay_spread: float = 0.0
    """Noise: each request's chunk delay is ``chunk_delay_s * exp(N(0, delay_spread))``."""
    seed: int = 0
    slots: int = 0
    """> 0: at most this many requests generate at once, the rest queue (before their first
    token): a server with a capacity, for the open loop and the capacity search."""


@dataclass
class FakeServer:
    url: str = ""
    behaviour: Behaviour = field(default_factory=Behaviour)
    requests: int = 0
    model_requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    tokens_sent: int = 0
    payloads: list[dict[str, Any]] = field(default_factory=list)
    peers: set[Any] = field(default_factory=set)
    _queue: asyncio.Semaphore | None = None

    def reset_counters(self) -> None:
        self.requests = self.model_requests = self.in_flight = self.max_in_flight = 0
        self.tokens_sent = 0
        self.payloads.clear()
        self.peers.clear()


def _sse(obj: Any, eol: str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj)
    return f"data: {data}{eol}{eol}".encode()


def _chunk(text: str, chat: bool, finish: str | None = None) -> dict[str, Any]:
    if chat:
        choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish}
    return {"id": "x", "object": "chunk", "model": MODEL, "choices": [choice]}


def _prompt_tokens(payload: dict[str, Any]) -> int:
    if "messages" in payload:
        return sum(len(m["content"].split()) for m in payload["messages"])
    prompt = payload.get("prompt", "")
    return len(prompt) if isinstance(prompt, list) else len(prompt.split())


def probe_answer(prompt: str, max_tokens: int) -> str:
    """The deterministic 'greedy' text the fake server generates for a prompt."""
    return " ".join(f"w{len(prompt) + i}" for i in range(max_tokens))


def _peer(request: web.Request) -> Any:
    return request.transport.get_extra_info("peername") if request.transport else None


def _make_app(server: FakeServer) -> web.Application:
    async def models(request: web.Request) -> web.Response:
        server.model_requests += 1
        server.peers.add(_peer(request))
        b = server.behaviour
        if b.models_status != 200:
            return web.json_response({"error": "nope"}, status=b.models_status)
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def generate(request: web.Request) -> web.StreamResponse:
        b = server.behaviour
        chat = request.path.endswith("/chat/completions")
        payload = await request.json()
        server.payloads.append(payload)
        server.peers.add(_peer(request))
        index = server.requests
        server.requests += 1
        mode = b.fail_mode if b.fail_every and (index + 1) % b.fail_every == 0 else b.mode
        n = int(payload["max_tokens"])
        if not payload.get("stream"):
            if mode == "hang":
                await asyncio.sleep(3600)
            if mode == "http_error":
                return web.json_response({"error": {"message": "overloaded"}}, status=503)
            if mode == "error_event":
                return web.json_response({"error": {"message": "boom", "code": 400}})
            text = probe_answer(str(payload.get("prompt") or payload["messages"][0]["content"]), n)
            if chat:
                message = {"role": "assistant", "content": text}
                return web.json_response({"choices": [{"message": message}]})
            return web.json_response({"choices": [{"text": text}]})
        server.in_flight += 1
        server.max_in_flight = max(server.max_in_flight, server.in_flight)
        counted = True
        queued: asyncio.Semaphore | None = None

        def leave() -> None:
            nonlocal counted
            if counted:
                server.in_flight -= 1
                counted = False

        try:
            if mode == "http_error":
                leave()
                error = {"message": "overloaded", "code": 503}
                return web.json_response({"error": error}, status=503)
            eol = "\r\n" if b.crlf else "\n"
            resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await resp.prepare(request)
            if mode == "hang":
                await asyncio.sleep(3600)
            if b.slots:
                if server._queue is None:
                    server._queue = asyncio.Semaphore(b.slots)
                await server._queue.acquire()
                queued = server._queue
            ttft = b.ttft_s
            if (b.slow_every and (index + 1) % b.slow_every == 0) or index in b.slow_at:
                ttft += b.slow_extra_ttft_s
            if ttft:
                await asyncio.sleep(ttft)
            out: list[bytes] = []
            delay = b.chunk_delay_s
            if b.delay_spread:
                delay *= math.exp(
                    random.Random(b.seed * 1_000_003 + index).gauss(0, b.delay_spread)
                )

            async def emit(data: bytes) -> None:
                if b.coalesce:
                    out.append(data)
                else:
                    await resp.write(data)

            if chat:  # role-only first chunk: carries no text, must not count as a token
                role = {"index": 0, "delta": {"role": "assistant", "content": ""}}
                await emit(_sse({"choices": [role]}, eol))
            sent = 0
            while sent < n:
                k = min(b.tokens_per_chunk, n - sent)
                await emit(_sse(_chunk("".join(f" t{sent + j}" for j in range(k)), chat), eol))
                sent += k
                if mode == "drop":
                    await resp.write(b'data: {"choi')
                    leave()
                    assert request.transport is not None
                    request.transport.close()
                    return resp
                if mode == "error_event":
                    leave()
                    await emit(_sse({"error": {"message": "boom", "code": 500}}, eol))
                    break
                if mode == "malformed":
                    leave()
                    await emit(f"data: {{not json{eol}{eol}".encode())
                    break
                if delay and sent < n:
                    await asyncio.sleep(delay)
            else:
                await emit(_sse(_chunk("", chat, finish="length"), eol))
                if mode != "no_usage":
                    usage = {
                        "prompt_tokens": _prompt_tokens(payload),
                        "completion_tokens": n,
                        "total_tokens": _prompt_tokens(payload) + n,
                    }
                    await emit(_sse({"id": "x", "choices": [], "usage": usage}, eol))
                server.tokens_sent += n
                leave()
                if mode != "no_done":
                    await emit(_sse("[DONE]", eol))
            if out:
                await resp.write(b"".join(out))
            await resp.write_eof()
            return resp
        finally:
            leave()
            if queued is not None:
                queued.release()

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", generate)
    app.router.add_post("/v1/chat/completions", generate)
    return app


@contextmanager
def serve(server: FakeServer | None = None) -> Iterator[FakeServer]:
    """Run a :class:`FakeServer` on a free loopback port in a background thread."""
    server = server or FakeServer()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    runner = web.AppRunner(_make_app(server), handler_cancellation=True, access_log=None)

    async def start() -> None:
        await runner.setup()
        await web.SockSite(runner, sock).start()

    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    server.url = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
