"""PD disaggregation in the simulated server: the KV hand-over from prefill to decode.

The prefill side's bootstrap registry (:class:`KVRooms`) and its bootstrap HTTP server
(:func:`build_bootstrap_app`, on ``--disaggregation-bootstrap-port``), and the decode
side's long-polling client (:class:`KVReceiver`). Separate from ``server`` because it is
a protocol of its own between two server processes, with its own timeouts, and touches
neither the engine nor a request.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import aiohttp
from aiohttp import web

# The router sends one request to prefill and decode at the same time, with the same
# bootstrap_host/bootstrap_port (the prefill's --disaggregation-bootstrap-port) and
# bootstrap_room. The prefill runs its forward and marks the room's KV ready in its
# bootstrap server; the decode long-polls that server for the room (one HTTP request per
# request, kept-alive connections, no polling loop), then decodes. A prefill that is gone
# refuses the connection (the decode fails the request at once); one that never serves the
# room makes the decode give up after SGLANG_DISAGGREGATION_WAITING_TIMEOUT seconds, and a
# ready room nobody fetches is dropped after SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT.
FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # srt/disaggregation/utils.py: warm-up/health, no transfer
KV_POLL_S = 5.0  # one long poll at most this long; then ask again (bounded in all)
KV_CONNECT_S = 3.0


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        return default
    return value if value > 0 else default


class _Room:
    __slots__ = ("created", "expire", "fut")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.fut: asyncio.Future[dict[str, Any]] = loop.create_future()
        self.created = time.monotonic()
        self.expire: asyncio.TimerHandle | None = None


class KVRooms:
    """The prefill's bootstrap registry: room -> its KV (ready, failed or still coming)."""

    def __init__(self, expire_s: float) -> None:
        self.expire_s = expire_s
        self.rooms: dict[int, _Room] = {}

    def _get(self, room: int) -> _Room:
        entry = self.rooms.get(room)
        if entry is None:
            loop = asyncio.get_running_loop()
            entry = self.rooms[room] = _Room(loop)
            entry.expire = loop.call_later(self.expire_s, self._expire, room, entry)
        return entry

    def _expire(self, room: int, entry: _Room) -> None:
        if self.rooms.get(room) is entry:
            del self.rooms[room]
        if not entry.fut.done():
            elapsed = time.monotonic() - entry.created
            entry.fut.set_result(
                {"error": f"Request {room} timed out after {elapsed:.1f}s in KVPoll.Bootstrapping"}
            )

    def expect(self, room: int) -> None:
        self._get(room)

    def ready(self, room: int, info: dict[str, Any]) -> None:
        fut = self._get(room).fut
        if not fut.done():
            fut.set_result(info)

    def fail(self, room: int, reason: str) -> None:
        fut = self._get(room).fut
        if not fut.done():
            fut.set_result({"error": reason})

    async def wait(self, room: int, timeout_s: float) -> dict[str, Any] | None:
        """The room's outcome ({"error": ...} when it failed), or None after ``timeout_s``."""
        entry = self._get(room)
        try:
            out = await asyncio.wait_for(asyncio.shield(entry.fut), timeout_s)
        except TimeoutError:
            return None
        if self.rooms.get(room) is entry:  # handed over: nothing left to keep
            del self.rooms[room]
            if entry.expire is not None:
                entry.expire.cancel()
        return out


ROOMS_KEY = web.AppKey("rooms", KVRooms)


async def _bootstrap_health(request: web.Request) -> web.Response:
    return web.Response(text="OK")


async def _bootstrap_kv(request: web.Request) -> web.Response:
    """``GET /kv/{room}?wait=S``: 200 when the room's KV is ready, 410 when it failed,
    204 when it is still coming after S seconds (ask again)."""
    try:
        room = int(request.match_info["room"])
        wait = min(max(float(request.query.get("wait", KV_POLL_S)), 0.0), 60.0)
    except ValueError:
        return web.json_response({"error": "bad room or wait"}, status=400)
    out = await request.app[ROOMS_KEY].wait(room, wait)
    if out is None:
        return web.Response(status=204)
    return web.json_response(out, status=410 if "error" in out else 200)


def build_bootstrap_app(rooms: KVRooms) -> web.Application:
    """The prefill's bootstrap server (``--disaggregation-bootstrap-port``)."""
    app = web.Application()
    app[ROOMS_KEY] = rooms
    app.router.add_get("/health", _bootstrap_health)
    app.router.add_get("/kv/{room}", _bootstrap_kv)
    return app


class _KVTransferError(Exception):
    """The decode did not get its room's KV (the message is SGLang's abort message); the
    request handler (``_generate_routes``) turns it into that abort, so it never leaves the
    server's modules."""


class KVReceiver:
    """The decode side: waits for the KV of one room from the prefill named in the request."""

    def __init__(self, waiting_timeout_s: float) -> None:
        self.waiting_timeout_s = waiting_timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def receive(self, *, host: str, port: int, room: int, rid: str) -> dict[str, Any]:
        """The prefill's hand-over once the room's KV is here (what it sent along: whether
        it ran the speculative algorithm, so the drafts start seeded); raise
        :class:`_KVTransferError` otherwise."""
        who = f"rank=0 decode_req.req.rid={rid!r} decode_req.req.bootstrap_room={room}"
        addr = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + self.waiting_timeout_s
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise _KVTransferError(
                    f"Decode transfer failed for request {who} with exception Request {room} "
                    f"timed out after {loop.time() - start:.1f}s in KVPoll.WaitingForInput"
                )
            wait = min(KV_POLL_S, left)
            timeout = aiohttp.ClientTimeout(total=wait + KV_CONNECT_S, sock_connect=KV_CONNECT_S)
            try:
                async with self._client().get(
                    f"http://{addr}/kv/{room}", params={"wait": f"{wait:.3f}"}, timeout=timeout
                ) as resp:
                    status = resp.status
                    body = await resp.read()
            except asyncio.TimeoutError:
                continue  # a prefill that does not answer: ask again until the deadline
            except aiohttp.ClientError as exc:
                raise _KVTransferError(
                    f"Decode handshake failed for request {who} with exception cannot reach "
                    f"the bootstrap server http://{addr}: {exc}"
                ) from None
            if status == 200:
                try:
                    info = json.loads(body)
                except ValueError:
                    info = {}
                return info if isinstance(info, dict) else {}
            if status == 204:
                continue
            try:
                reason = str(json.loads(body).get("error", ""))
            except (ValueError, AttributeError):
                reason = body.decode("utf-8", "replace")[:200]
            raise _KVTransferError(
                f"Decode transfer failed for request {who} with exception {reason or status}"
            )
