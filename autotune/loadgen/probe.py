"""One greedy, non-streaming request: the text a configuration generates.

Used as a correctness gate: a configuration that is fast but answers differently from the
baseline at temperature 0 (a broken kernel, a bad all-reduce protocol) is wrong, not fast.

Runs on asyncio even though callers are synchronous: httpx's sync timeouts are per socket
operation, so a server that trickles a byte a second would hold a sync call forever;
``asyncio.wait_for`` gives each exchange a true total limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import httpx

from autotune.aio import run_sync
from autotune.errors import BenchError
from autotune.loadgen._http import (
    JSON_HEADERS,
    Deadline,
    base_url,
    connection_error,
    endpoint,
    error_text,
    model_from_listing,
    snippet,
    unreachable,
)
from autotune.loadgen.spec import Api

T = TypeVar("T")
_CONNECT_TIMEOUT_S = 10.0


def probe_text(
    url: str,
    *,
    prompt: str,
    max_tokens: int,
    model: str | None = None,
    api: Api = "completions",
    timeout_s: float = 30.0,
    deadline: float | None = None,
) -> str:
    """Generated text of one temperature-0 request; :class:`BenchError` on any failure.

    ``timeout_s`` limits each HTTP exchange in total (``/v1/models``, then the request);
    ``deadline`` (a ``time.monotonic()`` instant) limits the whole call.
    """
    return run_sync(
        aprobe_text(
            url,
            prompt=prompt,
            max_tokens=max_tokens,
            model=model,
            api=api,
            timeout_s=timeout_s,
            deadline=deadline,
        )
    )


async def aprobe_text(
    url: str,
    *,
    prompt: str,
    max_tokens: int,
    model: str | None = None,
    api: Api = "completions",
    timeout_s: float = 30.0,
    deadline: float | None = None,
) -> str:
    """:func:`probe_text` for async callers."""
    base = base_url(url)
    limit = Deadline(deadline)
    body: dict[str, object] = {"max_tokens": max_tokens, "temperature": 0, "stream": False}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    timeout = httpx.Timeout(
        connect=min(timeout_s, _CONNECT_TIMEOUT_S), read=timeout_s, write=timeout_s, pool=timeout_s
    )
    async with httpx.AsyncClient(base_url=base, timeout=timeout, trust_env=False) as client:

        async def exchange(
            what: str, request: Coroutine[Any, Any, httpx.Response]
        ) -> httpx.Response:
            wait, by_deadline = limit.cap(timeout_s)
            if by_deadline and wait <= 0:
                request.close()
                raise BenchError(f"probe request to {base}: trial deadline reached")
            try:
                return await asyncio.wait_for(request, wait)
            except asyncio.TimeoutError:
                if by_deadline:
                    raise BenchError(
                        f"probe request to {base}: trial deadline reached during {what}"
                    ) from None
                raise BenchError(
                    f"probe request to {base} timed out after {timeout_s:g} s ({what})"
                ) from None
            except httpx.ConnectError as exc:
                raise BenchError(unreachable(base, exc)) from None
            except (httpx.HTTPError, OSError) as exc:
                raise BenchError(
                    f"probe request to {base} failed: {connection_error(base, exc)}"
                ) from None
            except Exception as exc:  # noqa: BLE001 - whatever the server did, say so
                raise BenchError(
                    f"probe request to {base} failed: unexpected {type(exc).__name__}: {exc}"
                ) from None

        if model is None:
            model = model_from_listing(
                await exchange("GET /v1/models", client.get("/v1/models")), base
            )
        body["model"] = model
        resp = await exchange(
            f"POST {endpoint(api)}", client.post(endpoint(api), json=body, headers=JSON_HEADERS)
        )
    return _answer_text(resp, base, api)


def _answer_text(resp: httpx.Response, base: str, api: Api) -> str:
    if resp.status_code != 200:
        raise BenchError(
            f"probe request to {base} answered HTTP {resp.status_code}: {snippet(resp.content)}"
        )
    try:
        payload = resp.json()
        if isinstance(payload, dict) and payload.get("error") is not None:
            raise BenchError(
                f"probe request to {base}: server error: {error_text(payload['error'])}"
            )
        choice = payload["choices"][0]
        text = choice["message"]["content"] if api == "chat" else choice["text"]
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        raise BenchError(
            f"probe request to {base}: unexpected answer {snippet(resp.content)}"
        ) from None
    if not isinstance(text, str):
        raise BenchError(f"probe request to {base}: no text in answer {snippet(resp.content)}")
    return text
