"""One greedy, non-streaming request: the text a configuration generates.

Used as a correctness gate: a configuration that is fast but answers differently from the
baseline at temperature 0 (a broken kernel, a bad all-reduce protocol) is wrong, not fast.
"""

from __future__ import annotations

import httpx

from autotune.errors import BenchError
from autotune.loadgen._http import (
    JSON_HEADERS,
    base_url,
    endpoint,
    error_text,
    model_from_listing,
    snippet,
    unreachable,
)
from autotune.loadgen.spec import Api


def probe_text(
    url: str,
    *,
    prompt: str,
    max_tokens: int,
    model: str | None = None,
    api: Api = "completions",
    timeout_s: float = 30.0,
) -> str:
    """Generated text of one temperature-0 request; :class:`BenchError` on any failure."""
    base = base_url(url)
    body: dict[str, object] = {"max_tokens": max_tokens, "temperature": 0, "stream": False}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    try:
        with httpx.Client(base_url=base, timeout=timeout_s, trust_env=False) as client:
            body["model"] = model or model_from_listing(client.get("/v1/models"), base)
            resp = client.post(endpoint(api), json=body, headers=JSON_HEADERS)
    except httpx.ConnectError as exc:
        raise BenchError(unreachable(base, exc)) from None
    except httpx.TimeoutException:
        raise BenchError(f"probe request to {base} timed out after {timeout_s:g} s") from None
    except httpx.HTTPError as exc:
        raise BenchError(f"probe request to {base} failed: {type(exc).__name__}: {exc}") from None
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
    except (ValueError, KeyError, IndexError, TypeError):
        raise BenchError(
            f"probe request to {base}: unexpected answer {snippet(resp.content)}"
        ) from None
    if not isinstance(text, str):
        raise BenchError(f"probe request to {base}: no text in answer {snippet(resp.content)}")
    return text
