"""HTTP/1.1 response framing of the load generator's transport, split at random places."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from autotune.loadgen.transport import _Conn


class _Transport:
    def __init__(self) -> None:
        self.closed = False
        self.sent = b""

    def write(self, data: bytes) -> None:
        self.sent += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


class _Sink:
    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = b""

    def head(self, status: int, headers: dict[str, str]) -> None:
        self.status, self.headers = status, headers

    def data(self, chunk: bytes) -> bool:
        self.body += chunk
        return False


EVENTS = b"".join(b'data: {"i": %d}\n\n' % i for i in range(40))


def _chunked(body: bytes, sizes: list[int]) -> bytes:
    out, i = b"", 0
    for k, size in enumerate(sizes):
        piece = body[i : i + size]
        i += size
        if not piece:
            break
        ext = b";name=v" if k % 7 == 3 else b""
        out += b"%x%s\r\n%s\r\n" % (len(piece), ext, piece)
    return out + b"0\r\nX-Trailer: 1\r\n\r\n"


RESPONSES = {
    "chunked": (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Type: text/event-stream\r\n\r\n" + _chunked(EVENTS, [16, 3, 200, 1, 40] * 20),
        True,
    ),
    "length": (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\n\r\n%s" % (len(EVENTS), EVENTS),
        True,
    ),
    "close": (b"HTTP/1.0 200 OK\r\n\r\n" + EVENTS, False),
}


async def _read(wire: bytes, seed: int) -> tuple[_Sink, _Conn]:
    conn, sink, rng = _Conn(), _Sink(), random.Random(seed)
    conn.connection_made(_Transport())  # type: ignore[arg-type]
    done = conn.start(b"GET / HTTP/1.1\r\n\r\n", sink)
    i = 0
    while i < len(wire) and not done.done():
        j = i + rng.choice([1, 2, 5, 13, 64, 4096])
        conn.data_received(wire[i:j])
        i = j
    if not done.done():
        conn.connection_lost(None)
    await done
    return sink, conn


@pytest.mark.parametrize("kind", sorted(RESPONSES))
def test_bodies_survive_any_split(kind: str) -> None:
    wire, reusable = RESPONSES[kind]
    expected = EVENTS
    for seed in range(60):
        sink, conn = asyncio.run(_read(wire, seed))
        assert sink.body == expected
        assert sink.status == (503 if kind == "length" else 200)
        assert conn.reusable is reusable


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (b"\x00\xffSSH-2.0\r\n", "illegal status line"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "invalid chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabc", "incomplete chunked"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "complete message body"),
        (b"", "without sending a response"),
    ],
)
def test_broken_responses_raise_remote_protocol_error(wire: bytes, message: str) -> None:
    async def main() -> None:
        conn = _Conn()
        conn.connection_made(_Transport())  # type: ignore[arg-type]
        done = conn.start(b"GET / HTTP/1.1\r\n\r\n", _Sink())
        if wire:
            conn.data_received(wire)
        if not done.done():
            conn.connection_lost(None)
        with pytest.raises(httpx.RemoteProtocolError, match=message):
            await done

    asyncio.run(main())
