"""Readiness probing over HTTP.

One probe is one short request: the launcher interleaves probes with checks of the process
and its log, so a probe must never block long enough to delay noticing a crash. SGLang's
``/health`` answers 503 while loading and 200 once a one-token generation works.

Each request has a *total* limit (connect + read timeout), enforced with asyncio: httpx's
sync timeouts apply per socket operation, so a server that trickles a byte every half
second (a wedged proxy, a half-dead process) would otherwise hold a probe forever.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from autotune.aio import run_sync

T = TypeVar("T")


@dataclass(frozen=True)
class ProbeResult:
    """Outcome of one probe: ``ok`` on HTTP 200; ``detail`` says what happened otherwise."""

    ok: bool
    status_code: int | None
    detail: str


class HealthProber:
    """Health and ``/server_info`` requests with bounded duration (no proxies, no redirects).

    Each call uses a fresh connection on its own short event loop (about 3 ms on loopback):
    nothing a misbehaving server did to one probe can affect the next.
    """

    def __init__(self, *, connect_timeout_s: float = 0.5, read_timeout_s: float = 2.0) -> None:
        self._timeout = httpx.Timeout(
            connect=connect_timeout_s,
            read=read_timeout_s,
            write=read_timeout_s,
            pool=read_timeout_s,
        )
        self._total_s = connect_timeout_s + read_timeout_s
        self._ssl: Any = None

    def _client(self) -> httpx.AsyncClient:
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context(trust_env=False)  # once: ~10 ms each
        return httpx.AsyncClient(
            timeout=self._timeout, verify=self._ssl, trust_env=False, follow_redirects=False
        )

    def probe(self, url: str) -> ProbeResult:
        """GET ``url`` once (status only, the body is not read); never raises for network
        errors and returns within connect + read timeout."""

        async def go() -> ProbeResult:
            async with self._client() as client, client.stream("GET", url) as response:
                detail = response.reason_phrase or ""
                return ProbeResult(response.status_code == 200, response.status_code, detail)

        try:
            return run_sync(asyncio.wait_for(go(), self._total_s))
        except asyncio.TimeoutError:
            return ProbeResult(False, None, f"no answer within {self._total_s:g} s")
        except httpx.TimeoutException as exc:
            return ProbeResult(False, None, f"{type(exc).__name__}: no answer in time")
        except (httpx.HTTPError, OSError) as exc:
            return ProbeResult(False, None, f"{type(exc).__name__}: {exc}".rstrip(": "))

    def fetch_json(self, url: str) -> dict[str, Any] | None:
        """GET a JSON object (``/server_info``), or None when unavailable, not an object, an
        ``{"error": ...}`` answer, or not complete within connect + read timeout."""

        async def go() -> httpx.Response:
            async with self._client() as client:
                return await client.get(url)

        try:
            response = run_sync(asyncio.wait_for(go(), self._total_s))
            if response.status_code != 200:
                return None
            data = response.json()
        except (asyncio.TimeoutError, httpx.HTTPError, OSError, ValueError, RecursionError):
            return None
        return data if isinstance(data, dict) and "error" not in data else None

    def close(self) -> None:
        """Nothing to release (no connection outlives a call); kept for the launchers."""

    def __enter__(self) -> HealthProber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
