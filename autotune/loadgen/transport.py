"""A lean HTTP/1.1 client for the streaming hot path: one keep-alive connection per worker.

Why not httpx here: profiled at C=256, h11 + httpcore + httpx cost ~25 us of CPU per
streamed chunk (event objects, state machine, async generators, context managers per
read), which capped one core at ~37k chunks/s. A closed loop needs little of that
machinery: each worker sends one request at a time on its own connection. So each
connection is an :class:`asyncio.Protocol` that parses the response head once and then
hands the de-chunked body bytes of every network read straight to a sink: one callback
per read, no coroutine switch per chunk. The worker awaits one future per request.

Servers close idle keep-alive connections (uvicorn after 5 s, the default of vLLM's, SGLang's
and transformers serve's servers): a request written just as the server closes is lost, and
reads as "Server disconnected without sending a response" (seen on the H200 when a slow
configuration's warm-up wave left connections idle for seconds). So a connection idle for
:data:`KEEPALIVE_EXPIRY_S` is not reused, and a request that a reused connection loses that way
(no byte of a response came back) is sent again once on a new connection, as browsers and
urllib3 do for a connection closed under them.

Failures raise httpx's exception types (``ConnectError``, ``ReadError``,
``RemoteProtocolError``, ...) so that :func:`autotune.loadgen._http.connection_error` words
them exactly as before. Timeouts are the caller's: cancelling :meth:`WorkerConnection.exchange`
closes the connection (a half-read response cannot be reused) and the next request opens a
new one.
"""

from __future__ import annotations

import asyncio
import ssl
from time import monotonic
from typing import Protocol
from urllib.parse import urlsplit

import httpx

KEEPALIVE_EXPIRY_S = 2.0
"""A connection idle longer than this is closed instead of reused (below uvicorn's 5 s)."""
MAX_HEAD_BYTES = 64 * 1024
"""A response head longer than this is refused (h11's limit is 16 KiB)."""
_NOTHING_BACK = "Server disconnected without sending a response"
_CRLF = b"\r\n"
_HEAD_END = b"\r\n\r\n"


class BodySink(Protocol):
    """Receives one response: the head once, then body bytes as they arrive."""

    def head(self, status: int, headers: dict[str, str]) -> None: ...

    def data(self, chunk: bytes) -> bool:
        """Body bytes (de-chunked); True stops reading (the connection is then closed)."""
        ...


class Endpoint:
    """Where requests go: host, port, TLS and the request-line path prefix of a base URL."""

    def __init__(self, base: str) -> None:
        parts = urlsplit(base)
        self.tls = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/")
        self.authority = parts.netloc.rsplit("@", 1)[-1]
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if self.tls else None

    def request_head(self, method: str, path: str, headers: dict[str, str], length: int) -> bytes:
        """The request line and headers; a body of ``length`` bytes follows."""
        lines = [f"{method} {self.prefix}{path} HTTP/1.1", f"Host: {self.authority}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        lines += [f"Content-Length: {length}", "Connection: keep-alive", "", ""]
        return "\r\n".join(lines).encode("latin-1")


class _Conn(asyncio.Protocol):
    """One TCP connection and the framing of the response being read on it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = False
        self._waiter: asyncio.Future[None] | None = None
        self._sink: BodySink | None = None
        self._in_head = False
        self._buf = b""
        self._mode = ""  # "chunked" | "length" | "close"
        self._left = 0  # length mode: body bytes left; chunked: data bytes left in the chunk
        self._need_crlf = False  # chunked: the CRLF after a chunk's data is still to come
        self._trailers = False  # chunked: after the last chunk, reading (empty) trailers
        self._keep_alive = True
        self.idle_since = monotonic()
        self.exchanges = 0  # requests written on this connection
        self.request = b""  # the last one, to send again if the server closed under it

    # ---- asyncio.Protocol ----
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.idle_since = monotonic()

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:
            self._close()  # bytes nobody asked for: the connection's framing is unknown
            return
        try:
            if self._in_head:
                self._head(data)
            elif self._mode == "chunked":
                self._chunked(data)
            elif self._mode == "length":
                self._length(data)
            else:
                self._emit(data)
        except httpx.RemoteProtocolError as exc:
            self._fail(exc)

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        if self._waiter is None or self._waiter.done():
            return
        if exc is None and not self._in_head and self._mode == "close":
            self._done()  # body delimited by the end of the connection
            return
        if exc is not None:
            err: Exception = httpx.ReadError(str(exc) or type(exc).__name__)
            err.__cause__ = exc
        elif self._in_head and not self._buf:
            err = httpx.RemoteProtocolError(f"{_NOTHING_BACK}.")
        else:
            where = "response head" if self._in_head else "message body"
            err = httpx.RemoteProtocolError(
                f"peer closed connection without sending complete {where}"
                + (" (incomplete chunked read)" if self._mode == "chunked" else "")
            )
        self._waiter.set_exception(err)

    # ---- framing ----
    def _head(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        while True:
            end = buf.find(_HEAD_END)
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise httpx.RemoteProtocolError("response head too long")
                if not buf[:5] == b"HTTP/"[: len(buf[:5])]:
                    raise httpx.RemoteProtocolError(f"illegal status line: {buf[:40]!r}")
                self._buf = buf
                return
            status, headers, version = _parse_head(buf[:end])
            buf = buf[end + 4 :]
            if 100 <= status < 200 and status != 101:
                continue  # interim response (100 Continue, 103 Early Hints)
            break
        if status == 101:
            raise httpx.RemoteProtocolError("unexpected protocol switch (101)")
        self._in_head = False
        self._buf = b""
        conn = headers.get("connection", "").lower()
        self._keep_alive = "close" not in conn and (version == "1.1" or "keep-alive" in conn)
        assert self._sink is not None
        self._sink.head(status, headers)
        te = headers.get("transfer-encoding", "").lower()
        if status in (204, 304):
            self._mode, self._left = "length", 0
        elif te:
            if te.rsplit(",", 1)[-1].strip() != "chunked":
                raise httpx.RemoteProtocolError(f"unsupported transfer-encoding {te!r}")
            self._mode, self._left = "chunked", 0
            self._need_crlf = self._trailers = False
        elif "content-length" in headers:
            try:
                self._left = int(headers["content-length"])
            except ValueError:
                raise httpx.RemoteProtocolError("invalid Content-Length") from None
            if self._left < 0:
                raise httpx.RemoteProtocolError("invalid Content-Length")
            self._mode = "length"
        else:
            self._mode = "close"
            self._keep_alive = False
        if self._mode == "length" and self._left == 0:
            self._done()
        elif buf:
            self.data_received(buf)

    def _length(self, data: bytes) -> None:
        if len(data) >= self._left:
            extra = len(data) > self._left
            body, self._left = data[: self._left], 0
            if self._emit(body):
                if extra:
                    self._keep_alive = False  # bytes beyond the body: framing is unknown
                self._done()
            return
        self._left -= len(data)
        self._emit(data)

    def _chunked(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        n = len(buf)
        pos = 0
        out: list[bytes] = []
        find = buf.find
        while pos < n:
            if not (self._left or self._need_crlf or self._trailers):
                # Fast path, a whole chunk in the buffer: "SIZE\r\nDATA\r\n".
                eol = find(_CRLF, pos)
                if eol > pos and buf[pos] != 48:  # not "0": not the last chunk
                    try:
                        size = int(buf[pos:eol], 16)
                    except ValueError:
                        size = -1
                    end = eol + 2 + size
                    if size > 0 and buf[end : end + 2] == _CRLF:
                        out.append(buf[eol + 2 : end])
                        pos = end + 2
                        continue
            left = self._left
            if left:
                take = n - pos if n - pos < left else left
                out.append(buf[pos : pos + take] if take < n else buf)
                pos += take
                self._left = left - take
                if self._left:
                    break
                self._need_crlf = True
            if self._need_crlf:
                if n - pos < 2:
                    break
                if buf[pos : pos + 2] != _CRLF:
                    raise httpx.RemoteProtocolError("chunk data not followed by CRLF")
                pos += 2
                self._need_crlf = False
                continue
            eol = find(_CRLF, pos)
            if eol < 0:
                if n - pos > 4096:
                    raise httpx.RemoteProtocolError("chunk size line too long")
                break
            line = buf[pos:eol]
            pos = eol + 2
            if self._trailers:
                if not line:  # end of the trailer section: the message is complete
                    if pos < n:
                        self._keep_alive = False
                    self._buf = b""
                    if not out or self._emit(b"".join(out)):
                        self._done()
                    return
                continue  # a trailer field: ignored
            try:
                size = int(line.split(b";", 1)[0], 16)
            except ValueError:
                raise httpx.RemoteProtocolError(f"invalid chunk size line {line[:40]!r}") from None
            if size < 0:
                raise httpx.RemoteProtocolError(f"invalid chunk size line {line[:40]!r}")
            if size == 0:
                self._trailers = True
            self._left = size
        self._buf = buf[pos:] if pos < n else b""
        if out:
            self._emit(out[0] if len(out) == 1 else b"".join(out))

    def _emit(self, body: bytes) -> bool:
        """Hand body bytes to the sink; False (and the connection closed) if it stopped."""
        if not body:
            return True
        assert self._sink is not None
        if self._sink.data(body):
            self._keep_alive = False
            self._done()
            return False
        return True

    # ---- completion ----
    def _done(self) -> None:
        waiter = self._waiter
        self._waiter = self._sink = None
        self.reusable = self._keep_alive and not self.closed
        self.idle_since = monotonic()
        if not self.reusable:
            self._close()
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, exc: Exception) -> None:
        waiter = self._waiter
        self._waiter = self._sink = None
        self._close()
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _close(self) -> None:
        self.reusable = False
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()

    def abort(self) -> None:
        """Drop the connection now (a cancelled or timed-out exchange)."""
        self._waiter = self._sink = None
        self.reusable = False
        if self.transport is not None and not self.transport.is_closing():
            self.closed = True
            self.transport.abort()

    def start(self, request: bytes, sink: BodySink) -> asyncio.Future[None]:
        assert self.transport is not None
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiter, self._sink = waiter, sink
        self._in_head, self._buf, self._mode = True, b"", ""
        self._keep_alive = True
        self.reusable = False
        self.exchanges += 1
        self.request = request
        self.transport.write(request)
        return waiter

    def fresh_for_reuse(self) -> bool:
        """Open, idle, and not idle so long that the server may be closing it."""
        return self.reusable and monotonic() - self.idle_since < KEEPALIVE_EXPIRY_S


def _parse_head(raw: bytes) -> tuple[int, dict[str, str], str]:
    """Status, headers (lower-case names) and version of a response head."""
    lines = raw.split(_CRLF)
    status_line = lines[0]
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or len(parts[1]) != 3:
        raise httpx.RemoteProtocolError(f"illegal status line: {status_line[:40]!r}")
    try:
        status = int(parts[1])
    except ValueError:
        raise httpx.RemoteProtocolError(f"illegal status line: {status_line[:40]!r}") from None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise httpx.RemoteProtocolError(f"illegal header line: {line[:40]!r}")
        key = name.decode("latin-1").lower()
        text = value.strip().decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return status, headers, parts[0][5:].decode("latin-1")


class WorkerConnection:
    """A worker's keep-alive connection, (re)opened on demand."""

    __slots__ = ("endpoint", "connect_timeout_s", "_conn")

    def __init__(self, endpoint: Endpoint, *, connect_timeout_s: float) -> None:
        self.endpoint = endpoint
        self.connect_timeout_s = connect_timeout_s
        self._conn: _Conn | None = None

    async def _connect(self) -> _Conn:
        ep = self.endpoint
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    _Conn,
                    ep.host,
                    ep.port,
                    ssl=ep.ssl,
                    server_hostname=ep.host if ep.ssl else None,
                ),
                self.connect_timeout_s,
            )
        except asyncio.TimeoutError:
            raise httpx.ConnectTimeout(
                f"no connection within {self.connect_timeout_s:g} s"
            ) from None
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
        return conn

    async def open_ahead(self) -> None:
        """Open the connection now unless an idle one is open, so that a request written
        later leaves at once (:meth:`start_now`); a failure is left to :meth:`exchange`,
        which opens it again and reports it."""
        conn = self._conn
        if conn is not None and conn.fresh_for_reuse():
            return
        if conn is not None:
            conn.abort()
        self._conn = None
        try:
            self._conn = await self._connect()
        except (httpx.HTTPError, OSError):
            return
        self._conn.reusable = True  # open, and nothing written on it yet

    async def exchange(self, request: bytes, sink: BodySink) -> None:
        """Send ``request`` (head + body) and feed the response to ``sink`` until it ends."""
        conn = self._conn
        if conn is None or not conn.fresh_for_reuse():
            if conn is not None:
                conn.abort()
            conn = self._conn = None
            conn = self._conn = await self._connect()
        await self.finish(conn.start(request, sink), sink)

    def start_now(self, request: bytes, sink: BodySink) -> asyncio.Future[None] | None:
        """Write ``request`` at once on the open keep-alive connection (no event-loop
        round trip before it leaves); ``None`` when a connection must be opened first (then
        :meth:`exchange`)."""
        conn = self._conn
        if conn is None or not conn.fresh_for_reuse():
            return None
        return conn.start(request, sink)

    async def finish(self, waiter: asyncio.Future[None], sink: BodySink) -> None:
        """Wait for the response of :meth:`start_now` like :meth:`exchange` does; a request
        that a reused connection lost before any response byte is sent once more on a new
        one (the server closed the idle connection as the request went out)."""
        conn = self._conn
        assert conn is not None
        try:
            await waiter
        except httpx.RemoteProtocolError as exc:
            conn.abort()
            self._conn = None
            if conn.exchanges < 2 or not str(exc).startswith(_NOTHING_BACK):
                raise
            retry = self._conn = await self._connect()
            await self.finish(retry.start(conn.request, sink), sink)
            return
        except BaseException:
            conn.abort()
            self._conn = None
            raise
        if not conn.reusable:
            self._conn = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.abort()
            self._conn = None
