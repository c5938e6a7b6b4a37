"""An OpenAI-compatible server that misbehaves on purpose, for fault-injection tests.

Run it for real, as its own process, so that faults are real faults (a crash is a dead
process, a reset is a TCP RST, garbage is bytes no HTTP parser accepts)::

    python tests/faults/faulty_server.py --host 127.0.0.1 --port 0 --fault hang --fault-after 4

It prints ``listening on http://HOST:PORT`` once it accepts connections (``--port 0`` picks
a free port). Hand-written HTTP/1.1 on stdlib asyncio streams, because the faults need
control over every byte on the wire; only what autotune's clients send is understood
(``Content-Length`` bodies, keep-alive).

Healthy: ``GET /health`` (503 during ``--ready-delay``), ``/health_generate``,
``/v1/models``, ``/server_info`` and ``/get_server_info``; ``POST /v1/completions`` and
``/v1/chat/completions``, streaming (text chunks, a finish chunk, a usage chunk when
``stream_options.include_usage``, ``data: [DONE]``) or not.

The first ``--fault-after`` completion requests (counted when they arrive) are answered
normally; every later one gets ``--fault``. ``--fault-scope all`` applies the fault to the
GET endpoints too (``hang_all`` always does, once the first N completions have arrived).

Faults (streaming requests; a one-body answer gets the closest equivalent):
``crash`` two chunks, then ``os._exit`` with the stream open; ``hang`` reads the request,
never sends a byte; ``hang_all`` the same on every endpoint, ``/health`` included;
``stall_mid_stream`` two chunks, then silence with the connection open; ``drip`` a byte
every ``--drip-interval`` seconds forever (SSE comments: never ``[DONE]``); ``http_500``,
``http_429`` (with ``Retry-After``); ``error_event`` 200 then ``data: {"error": ...}``;
``malformed`` 200 then ``data: {not json``; ``bad_shape`` valid JSON of wrong shapes,
cycling through :data:`BAD_STREAM_EVENTS` / :data:`BAD_BODIES`; ``no_done`` a clean end
without ``[DONE]`` (one-body: fewer bytes than ``Content-Length``); ``reset`` TCP RST
mid-answer; ``slow_headers`` trickles the status line and headers a byte at a time and never
finishes them (beats per-read timeouts; ``hang`` covers "nothing before the status line");
``garbage`` non-HTTP bytes, then close; ``html`` a 200 ``text/html`` page instead of the
answer; ``binary`` a 200 whose body (or SSE data) is not UTF-8; ``ok`` never faults.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MODEL = "faulty-model"
MODES = (
    "ok",
    "crash",
    "hang",
    "hang_all",
    "stall_mid_stream",
    "drip",
    "http_500",
    "http_429",
    "error_event",
    "malformed",
    "bad_shape",
    "no_done",
    "reset",
    "slow_headers",
    "garbage",
    "html",
    "binary",
)
FOREVER_S = 10**6
REASONS = {200: "OK", 404: "Not Found", 429: "Too Many Requests", 500: "Internal Server Error"}
REASONS[503] = "Service Unavailable"
GARBAGE = b"\x00\xff\xfeSSH-2.0-OpenSSH_9.6\r\n\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"

HTML = b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>\n"
BINARY = b'{"choices": [{"text": "\xff\xfe\xc3\x28 \x80"}]}'
BAD_STREAM_EVENTS: tuple[Any, ...] = (
    {"choices": {"0": {"text": "x"}}},  # choices: an object, not a list
    {"choices": [{"index": 0, "text": 42}]},  # text: a number
    {"choices": [], "usage": "ten tokens"},  # usage: a string
    {"choices": [], "usage": [1, 2, 3]},  # usage: a list
    [{"choices": [{"text": "x"}]}],  # the event is a list
    {"choices": ["text"]},  # choices[0]: a string
    {"choices": [{"index": 0, "delta": "x", "text": {"a": 1}}]},  # delta a string, text a dict
    7,  # a bare number
)
"""``bad_shape`` cycles through these per faulty request: valid JSON, wrong shapes."""
BAD_BODIES: tuple[Any, ...] = (
    {"choices": {"0": {"text": "x"}}},
    {"choices": [{"text": 42, "message": {"content": 42}}]},
    {"choices": [{"text": None, "message": "x"}]},
    {"data": {"id": 5}},
    [{"choices": []}],
    {"data": [{"id": {"not": "a string"}}]},
    "just a string",
)
"""``bad_shape`` bodies of non-streaming answers (probe, ``/v1/models``, ``/server_info``)."""


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class Conn:
    """One client connection: buffered writes, chunked framing, abrupt endings."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def head(self, status: int, headers: dict[str, str]) -> None:
        lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        await self.send(("\r\n".join(lines) + "\r\n\r\n").encode())

    async def full(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        await self.head(status, {"Content-Type": ctype, "Content-Length": str(len(body))})
        await self.send(body)

    async def json(self, status: int, obj: Any) -> None:
        await self.full(status, json.dumps(obj).encode())

    async def start_stream(self) -> None:
        headers = {"Content-Type": "text/event-stream", "Transfer-Encoding": "chunked"}
        await self.head(200, {**headers, "Cache-Control": "no-cache"})

    async def chunk(self, data: bytes) -> None:
        await self.send(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    async def event(self, obj: Any) -> None:
        data = obj if isinstance(obj, str) else json.dumps(obj)
        await self.chunk(f"data: {data}\n\n".encode())

    async def end_stream(self) -> None:
        await self.send(b"0\r\n\r\n")

    def reset(self) -> None:
        """Close with a TCP RST (SO_LINGER 0) instead of a FIN."""
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()


def crash() -> None:
    """Die like a killed process: no cleanup, no flushing, sockets closed by the kernel."""
    os._exit(3)


class FaultyServer:
    def __init__(
        self,
        fault: str,
        fault_after: int,
        *,
        ready_delay_s: float = 0.0,
        scope: str = "completions",
        drip_interval_s: float = 0.5,
    ) -> None:
        self.fault = fault
        self.drip_interval_s = drip_interval_s
        self.fault_after = fault_after
        self.ready_at = time.monotonic() + ready_delay_s
        self.scope = "all" if fault == "hang_all" else scope
        self.admitted = 0
        self.faulty = 0

    # ------------------------------------------------------------------ connection
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Conn(writer)
        try:
            while True:
                request = await read_request(reader)
                if request is None or not await self.dispatch(request, conn):
                    break
        except (
            ConnectionError,
            ValueError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
        ):
            pass
        finally:
            if not writer.transport.is_closing():
                writer.close()

    async def dispatch(self, req: Request, conn: Conn) -> bool:
        """Answer one request; False closes the connection."""
        if req.method == "POST" and req.path in ("/v1/completions", "/v1/chat/completions"):
            try:
                payload = json.loads(req.body)
            except ValueError:
                await conn.json(400, {"error": {"message": "body is not JSON", "code": 400}})
                return True
            index = self.admitted
            self.admitted += 1
            if self.fault != "ok" and index >= self.fault_after:
                mode_index = self.faulty
                self.faulty += 1
                if payload.get("stream"):
                    return await self.faulty_stream(conn, payload, mode_index)
                return await self.faulty_body(conn, mode_index)
            await self.completion(conn, payload, chat=req.path.endswith("/chat/completions"))
            return True
        if req.method != "GET":
            await conn.json(404, {"error": {"message": f"no route {req.method} {req.path}"}})
            return True
        if self.scope == "all" and self.fault != "ok" and self.admitted >= self.fault_after:
            mode_index = self.faulty
            self.faulty += 1
            return await self.faulty_body(conn, mode_index)
        if req.path in ("/health", "/health_generate"):
            ready = time.monotonic() >= self.ready_at
            await conn.full(200 if ready else 503, b"", "text/plain")
        elif req.path == "/v1/models":
            await conn.json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        elif req.path in ("/server_info", "/get_server_info"):
            await conn.json(200, {"version": "faulty", "model_path": MODEL, "tp_size": 1})
        else:
            await conn.json(404, {"error": {"message": f"no route GET {req.path}"}})
        return True

    # ------------------------------------------------------------------ healthy
    async def completion(self, conn: Conn, payload: dict[str, Any], *, chat: bool) -> None:
        n = min(int(payload.get("max_tokens") or 16), 256)
        words = [f" w{i}" for i in range(n)]
        if not payload.get("stream"):
            text = "".join(words)
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            await conn.json(
                200, {"id": "f", "model": MODEL, "choices": [choice], "usage": usage(n)}
            )
            return
        await conn.start_stream()
        for word in words:
            await conn.event(text_chunk(word, chat))
        final = text_chunk("", chat)
        final["choices"][0]["finish_reason"] = "length"
        await conn.event(final)
        if (payload.get("stream_options") or {}).get("include_usage"):
            await conn.event({"id": "f", "model": MODEL, "choices": [], "usage": usage(n)})
        await conn.event("[DONE]")
        await conn.end_stream()

    # ------------------------------------------------------------------ faults
    async def faulty_stream(self, conn: Conn, payload: dict[str, Any], index: int) -> bool:
        chat = "messages" in payload
        mode = self.fault
        if mode in ("hang", "hang_all"):
            await asyncio.sleep(FOREVER_S)
        if mode in ("http_500", "http_429", "slow_headers", "garbage", "html"):
            return await self.faulty_body(conn, index)
        await conn.start_stream()
        await conn.event(text_chunk(" w0", chat))
        await conn.event(text_chunk(" w1", chat))
        if mode == "crash":
            crash()
        elif mode == "stall_mid_stream":
            await asyncio.sleep(FOREVER_S)
        elif mode == "drip":
            await self.drip(conn, b": drip\n\n", chunked=True)
        elif mode == "reset":
            conn.reset()
            return False
        elif mode == "error_event":
            error = {"message": "fault injected: engine error", "type": "ServerError", "code": 500}
            await conn.event({"error": error})
        elif mode == "malformed":
            await conn.chunk(b"data: {not json\n\n")
        elif mode == "bad_shape":
            await conn.event(BAD_STREAM_EVENTS[index % len(BAD_STREAM_EVENTS)])
        elif mode == "binary":
            await conn.chunk(b"data: " + BINARY + b"\n\n")
        elif mode == "no_done":
            await conn.event({"id": "f", "choices": [], "usage": usage(2)})
            await conn.end_stream()
            return True
        await conn.event("[DONE]")
        await conn.end_stream()
        return True

    async def faulty_body(self, conn: Conn, index: int) -> bool:
        """The fault for a request answered with one body (probe, GET endpoints)."""
        mode = self.fault
        if mode in ("hang", "hang_all"):
            await asyncio.sleep(FOREVER_S)
        if mode == "crash":
            crash()
        if mode == "stall_mid_stream":
            await conn.head(200, {"Content-Type": "application/json", "Content-Length": "400"})
            await conn.send(b'{"choices": [{"te')
            await asyncio.sleep(FOREVER_S)
        if mode == "drip":
            await conn.head(
                200, {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
            )
            await self.drip(conn, b" ", chunked=True)
        if mode == "http_500":
            error = {"message": "fault injected", "type": "InternalServerError", "code": 500}
            await conn.json(500, {"error": error})
        elif mode == "http_429":
            body = json.dumps({"error": {"message": "too many requests", "code": 429}}).encode()
            headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
            await conn.head(429, {**headers, "Retry-After": "1"})
            await conn.send(body)
        elif mode == "error_event":
            await conn.json(
                200, {"error": {"message": "fault injected: engine error", "code": 500}}
            )
        elif mode == "malformed":
            await conn.full(200, b"{not json")
        elif mode == "bad_shape":
            await conn.json(200, BAD_BODIES[index % len(BAD_BODIES)])
        elif mode == "no_done":
            # Promise more body than is sent, then close: a truncated answer.
            await conn.head(200, {"Content-Type": "application/json", "Content-Length": "400"})
            await conn.send(b'{"choices": [{"text": "trunc')
            return False
        elif mode == "reset":
            await conn.head(200, {"Content-Type": "application/json", "Content-Length": "400"})
            await conn.send(b'{"choices": [')
            conn.reset()
            return False
        elif mode == "slow_headers":
            await self.drip(conn, b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 4096, chunked=False)
        elif mode == "garbage":
            await conn.send(GARBAGE)
            return False
        elif mode == "html":
            await conn.full(200, HTML, "text/html; charset=utf-8")
        elif mode == "binary":
            await conn.full(200, BINARY)
        return True

    async def drip(self, conn: Conn, pattern: bytes, *, chunked: bool) -> None:
        """One byte every ``--drip-interval`` seconds, forever: a per-read timeout (which
        restarts with every byte) never fires; only a total limit ends the request."""
        i = 0
        while True:
            byte = pattern[i % len(pattern) : i % len(pattern) + 1]
            await (conn.chunk(byte) if chunked else conn.send(byte))
            i += 1
            await asyncio.sleep(self.drip_interval_s)


def text_chunk(text: str, chat: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": None}
    if chat:
        choice["delta"] = {"content": text}
    else:
        choice["text"] = text
    return {"id": "f", "object": "chunk", "model": MODEL, "choices": [choice]}


def usage(n: int) -> dict[str, int]:
    return {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """The next request on a keep-alive connection, or None when the client closed it."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target, _version = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length") or 0)
    body = await reader.readexactly(length) if length else b""
    return Request(method, target.split("?", 1)[0], headers, body)


async def serve(args: argparse.Namespace) -> None:
    app = FaultyServer(
        args.fault,
        args.fault_after,
        ready_delay_s=args.ready_delay,
        scope=args.fault_scope,
        drip_interval_s=args.drip_interval,
    )
    server = await asyncio.start_server(app.handle, args.host, args.port, limit=2**20)
    port = server.sockets[0].getsockname()[1]
    sys.stdout.write(f"listening on http://{args.host}:{port}\n")
    sys.stdout.flush()
    async with server:
        await server.serve_forever()


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--fault", choices=MODES, default="ok")
    p.add_argument(
        "--fault-after", type=int, default=0, help="completion requests answered normally first"
    )
    p.add_argument("--ready-delay", type=float, default=0.0, help="seconds /health answers 503")
    p.add_argument("--drip-interval", type=float, default=0.5, help="seconds between bytes")
    p.add_argument(
        "--fault-scope",
        choices=("completions", "all"),
        default="completions",
        help="'all' also breaks the GET endpoints (/health, /v1/models, /server_info)",
    )
    return p.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
