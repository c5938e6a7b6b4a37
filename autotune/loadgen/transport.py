"""Worker-affine connections behind one shared ``httpx.AsyncClient``.

httpcore's connection pool scans every connection (and polls each socket) on every request
start and end: O(C) per request with a quadratic term, which at C=256 costs more CPU than
the streams themselves. A closed loop does not need a shared pool: each worker sends one
request at a time, so each worker gets its own single keep-alive connection, chosen through
a context variable that the worker's task sets. Total connections = C.
"""

from __future__ import annotations

from contextvars import ContextVar
from types import TracebackType

import httpx

WORKER: ContextVar[int] = ContextVar("autotune_loadgen_worker", default=0)
"""Index of the worker whose connection a request uses (set once per worker task)."""


class WorkerTransport(httpx.AsyncBaseTransport):
    """``workers`` single-connection HTTP/1.1 keep-alive pools, picked by :data:`WORKER`."""

    def __init__(self, workers: int, *, keepalive_expiry: float = 30.0) -> None:
        ssl_context = httpx.create_ssl_context(trust_env=False)  # built once, shared
        limits = httpx.Limits(
            max_connections=1, max_keepalive_connections=1, keepalive_expiry=keepalive_expiry
        )
        self._pools = [
            httpx.AsyncHTTPTransport(
                verify=ssl_context,
                limits=limits,
                http1=True,
                http2=False,
                trust_env=False,
                retries=0,
            )
            for _ in range(max(workers, 1))
        ]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        pools = self._pools
        return await pools[WORKER.get() % len(pools)].handle_async_request(request)

    async def aclose(self) -> None:
        for pool in self._pools:
            await pool.aclose()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        await self.aclose()
