"""Readiness probing over HTTP.

One probe is one short request: the launcher interleaves probes with checks of the process
and its log, so a probe must never block long enough to delay noticing a crash. SGLang's
``/health`` answers 503 while loading and 200 once a one-token generation works.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class ProbeResult:
    """Outcome of one probe: ``ok`` on HTTP 200; ``detail`` says what happened otherwise."""

    ok: bool
    status_code: int | None
    detail: str


class HealthProber:
    """A reusable HTTP client for health and ``/server_info`` requests (no proxies)."""

    def __init__(self, *, connect_timeout_s: float = 0.5, read_timeout_s: float = 2.0) -> None:
        timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s)
        self._client = httpx.Client(timeout=timeout, trust_env=False, follow_redirects=False)

    def probe(self, url: str) -> ProbeResult:
        """GET ``url`` once; never raises for network errors."""
        try:
            response = self._client.get(url)
        except httpx.HTTPError as exc:
            return ProbeResult(False, None, f"{type(exc).__name__}: {exc}".rstrip(": "))
        detail = response.reason_phrase or ""
        return ProbeResult(response.status_code == 200, response.status_code, detail)

    def fetch_json(self, url: str) -> dict[str, Any] | None:
        """GET a JSON object (``/server_info``), or None when unavailable or not an object."""
        try:
            response = self._client.get(url)
            if response.status_code != 200:
                return None
            data = response.json()
        except (httpx.HTTPError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HealthProber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
