"""The served model's name, from ``GET /v1/models``, when the load spec names none.

Asked once per session on the first worker's keep-alive connection (that worker keeps using
it), within ``request_timeout_s`` and the trial deadline; every way it fails is a
:class:`~autotune.errors.BenchError` with the same messages as the load's own requests.
"""

from __future__ import annotations

import asyncio

import httpx

from autotune.errors import BenchError
from autotune.loadgen._http import (
    Deadline,
    connection_error,
    model_from_listing,
    unreachable,
)
from autotune.loadgen.transport import Endpoint, WorkerConnection


class _Collect:
    """Body sink of a plain (non-streamed) answer: status, headers and up to 1 MiB."""

    __slots__ = ("status", "headers", "body")

    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = bytearray()

    def head(self, status: int, headers: dict[str, str]) -> None:
        self.status, self.headers = status, headers

    def data(self, chunk: bytes) -> bool:
        self.body += chunk
        return len(self.body) > 2**20


async def _resolve_model(
    conn: WorkerConnection, target: Endpoint, base: str, timeout_s: float, limit: Deadline
) -> str:
    """The served model's name from ``GET /v1/models``, within ``timeout_s`` in total.

    Asked on the first worker's connection, which that worker then keeps using.
    """
    wait, by_deadline = limit.cap(timeout_s)
    if by_deadline and wait <= 0:
        raise BenchError(f"trial deadline reached before the load on {base} started")
    sink = _Collect()
    request = target.request_head("GET", "/v1/models", {"Accept": "application/json"}, 0)
    try:
        await asyncio.wait_for(conn.exchange(request, sink), wait)
    except asyncio.TimeoutError:
        if by_deadline:
            raise BenchError(
                f"trial deadline reached while asking {base}/v1/models for the model name"
            ) from None
        raise BenchError(f"GET {base}/v1/models timed out after {wait:g} s") from None
    except httpx.ConnectError as exc:
        raise BenchError(f"server unreachable: {unreachable(base, exc)}") from None
    except (httpx.HTTPError, OSError) as exc:
        raise BenchError(f"GET {base}/v1/models failed: {connection_error(base, exc)}") from None
    resp = httpx.Response(sink.status, headers=sink.headers, content=bytes(sink.body))
    return model_from_listing(resp, base)
