"""Small HTTP helpers shared by the streaming client and the correctness probe."""

from __future__ import annotations

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


def model_from_listing(resp: httpx.Response, base: str) -> str:
    """The first model id of a ``GET /v1/models`` answer, or a clear :class:`BenchError`."""
    if resp.status_code != 200:
        raise BenchError(
            f"GET {base}/v1/models answered HTTP {resp.status_code} ({snippet(resp.content)}); "
            "set the model name explicitly"
        )
    try:
        return str(resp.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise BenchError(
            f"GET {base}/v1/models returned no model id ({snippet(resp.content)}); "
            "set the model name explicitly"
        ) from None
