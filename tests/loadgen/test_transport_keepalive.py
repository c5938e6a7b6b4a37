"""Keep-alive connections a server closes while idle: what the H200 study met.

A real asyncio server on loopback answers requests with a fixed keep-alive response and can
close a connection without answering the request that arrives on it (a server closing an idle
connection as the request goes out: uvicorn's 5 s keep-alive). The worker connection must
(1) not reuse a connection idle longer than KEEPALIVE_EXPIRY_S, (2) send a request lost that
way on a reused connection once more on a new one, and (3) not retry a request that a new
connection loses, nor a request lost after part of its response.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest

from autotune.loadgen import transport
from autotune.loadgen.transport import Endpoint, WorkerConnection

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok"
REQUEST = b"GET /x HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n"


class _Sink:
    def __init__(self) -> None:
        self.status, self.body = 0, b""

    def head(self, status: int, headers: dict[str, str]) -> None:
        self.status = status

    def data(self, chunk: bytes) -> bool:
        self.body += chunk
        return False


class Server:
    """Counts connections and requests; ``drop`` lists the request numbers (1-based, over
    all connections) that are answered by closing the connection; ``half`` those answered
    by a response head and then a close."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests = 0
        self.drop: set[int] = set()
        self.half: set[int] = set()
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if not head:
                    break
                self.requests += 1
                if self.requests in self.drop:
                    break
                if self.requests in self.half:
                    writer.write(OK[:-2].replace(b"Content-Length: 2", b"Content-Length: 9"))
                    await writer.drain()
                    break
                writer.write(OK)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def served(body: Callable[[Server], Awaitable[None]]) -> None:
    """Run ``body`` against a fresh server on loopback (no async plugin needed)."""

    async def main() -> None:
        state = Server()
        srv = await asyncio.start_server(state.handle, "127.0.0.1", 0)
        state.port = srv.sockets[0].getsockname()[1]
        async with srv:
            await body(state)

    asyncio.run(main())


async def _exchange(conn: WorkerConnection) -> _Sink:
    sink = _Sink()
    await asyncio.wait_for(conn.exchange(REQUEST, sink), 10)
    return sink


def _worker(server: Server) -> WorkerConnection:
    return WorkerConnection(Endpoint(f"http://127.0.0.1:{server.port}"), connect_timeout_s=5)


def test_a_recent_connection_is_reused_an_idle_one_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "KEEPALIVE_EXPIRY_S", 0.3)
    served(_reuse_then_expire)


async def _reuse_then_expire(server: Server) -> None:
    conn = _worker(server)
    for _ in range(3):
        assert (await _exchange(conn)).body == b"ok"
    assert server.connections == 1
    await asyncio.sleep(0.4)  # idle past the expiry: the server may be closing it
    assert (await _exchange(conn)).body == b"ok"
    assert server.connections == 2
    assert conn.start_now(REQUEST, _Sink()) is not None  # fresh again: written at once
    conn.close()


def test_a_request_lost_on_a_reused_connection_is_sent_again() -> None:
    served(_lost_then_resent)


async def _lost_then_resent(server: Server) -> None:
    server.drop = {2}  # the server closes the kept-alive connection under request 2
    conn = _worker(server)
    assert (await _exchange(conn)).body == b"ok"
    sink = await _exchange(conn)
    assert (sink.status, sink.body) == (200, b"ok")
    assert (server.connections, server.requests) == (2, 3)
    # The same through start_now/finish, the load generator's hot path.
    server.drop = {4}
    sink = _Sink()
    started = conn.start_now(REQUEST, sink)
    assert started is not None
    await asyncio.wait_for(conn.finish(started, sink), 10)
    assert (sink.body, server.connections, server.requests) == (b"ok", 3, 5)
    conn.close()


def test_no_retry_on_a_new_connection_nor_after_a_partial_response() -> None:
    served(_not_retried)


async def _not_retried(server: Server) -> None:
    server.drop = {1}  # the first request on a brand-new connection: a real failure
    conn = _worker(server)
    with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
        await _exchange(conn)
    assert server.requests == 1
    server.half = {3}  # request 3 arrives on the kept-alive connection, gets a head only
    assert (await _exchange(conn)).body == b"ok"
    with pytest.raises(httpx.RemoteProtocolError, match="message body"):
        await _exchange(conn)
    assert server.requests == 3
    # A retry that is lost as well is reported, not retried again.
    server.drop = {5, 6}
    assert (await _exchange(conn)).body == b"ok"  # request 4 on a new connection
    with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
        await _exchange(conn)
    assert server.requests == 6
    conn.close()
