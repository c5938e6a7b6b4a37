"""Small HTTP helpers shared by the streaming client and the correctness probe.

Every failure a server can cause ends as one line of text naming the fault (timed out,
connection reset, invalid HTTP, HTTP status, server error, malformed answer), so a failed
trial's ``reason`` says what the server did without a traceback.
"""

from __future__ import annotations

import errno
import time
from time import perf_counter
from typing import Any
from urllib.parse import urlsplit

import httpx

from autotune.errors import BenchError, ConfigError

JSON_HEADERS = {"content-type": "application/json", "accept": "text/event-stream, application/json"}


def base_url(url: str) -> str:
    """``http://h:p``, ``http://h:p/`` and ``http://h:p/v1`` all mean the server root."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"not an http(s) URL: {url!r}", field="url")
    root = url.strip().rstrip("/")
    return root.removesuffix("/v1")


def endpoint(api: str) -> str:
    return "/v1/chat/completions" if api == "chat" else "/v1/completions"


def snippet(raw: bytes | str, limit: int = 200) -> str:
    """A short one-line excerpt of a body for error messages."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def error_text(err: Any) -> str:
    """The message of an OpenAI-style ``{"error": ...}`` value (dict or string)."""
    if isinstance(err, dict):
        message = err.get("message") or err.get("msg") or err
        code = err.get("code") or err.get("type")
        return f"{message} ({code})" if code else str(message)
    return str(err)


def unreachable(base: str, exc: Exception) -> str:
    return f"cannot connect to {base}: {type(exc).__name__}: {exc or 'no detail'}"


def connection_error(base: str, exc: BaseException) -> str:
    """What a transport-level failure means, with the exception type for grep-ability."""
    name = type(exc).__name__
    detail = f"{name}: {exc}" if str(exc) else name
    if isinstance(exc, httpx.ConnectError):
        return unreachable(base, exc)
    if isinstance(exc, httpx.ConnectTimeout):
        return f"cannot connect to {base}: connect timed out ({name})"
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out waiting for {base} ({detail})"
    if _is_reset(exc):
        return f"connection reset by {base} ({detail})"
    if isinstance(exc, httpx.RemoteProtocolError):
        return f"invalid or truncated HTTP response from {base} ({detail})"
    if isinstance(exc, (httpx.ReadError, httpx.WriteError, OSError)):
        return f"connection to {base} lost ({detail})"
    return detail


def _is_reset(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(8):  # the OS error sits a few causes deep under httpx/httpcore wrappers
        if seen is None:
            return False
        if isinstance(seen, ConnectionResetError) or (
            isinstance(seen, OSError) and seen.errno == errno.ECONNRESET
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class Deadline:
    """A ``time.monotonic()`` instant (or none) seen from ``perf_counter()`` time."""

    __slots__ = ("at",)

    def __init__(self, monotonic_at: float | None) -> None:
        self.at = (
            None if monotonic_at is None else perf_counter() + (monotonic_at - time.monotonic())
        )

    def left(self) -> float | None:
        """Seconds left (may be <= 0), or None without a deadline."""
        return None if self.at is None else self.at - perf_counter()

    def cap(self, timeout_s: float) -> tuple[float, bool]:
        """``(timeout, by_deadline)``: ``timeout_s`` or the time left, whichever is less."""
        left = self.left()
        if left is not None and left < timeout_s:
            return max(left, 0.0), True
        return timeout_s, False

    def earliest(self, at: float) -> float:
        """The earlier of the perf_counter instant ``at`` and the deadline."""
        return at if self.at is None else min(at, self.at)


def model_from_listing(resp: httpx.Response, base: str) -> str:
    """The first model id of a ``GET /v1/models`` answer, or a clear :class:`BenchError`."""
    if resp.status_code != 200:
        raise BenchError(
            f"GET {base}/v1/models answered HTTP {resp.status_code} ({snippet(resp.content)}); "
            "set the model name explicitly"
        )
    try:
        model = resp.json()["data"][0]["id"]
        if not isinstance(model, str) or not model:
            raise TypeError("model id is not a string")
        return model
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        raise BenchError(
            f"GET {base}/v1/models returned no model id ({snippet(resp.content)}); "
            "set the model name explicitly"
        ) from None
