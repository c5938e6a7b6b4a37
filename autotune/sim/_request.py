"""One generation request of the simulated server, and how its responses are encoded.

:class:`Req` holds a request from arrival to its last written chunk: its prompt key and
token counts, its prefix-cache pages, the tokens generated so far, and the SSE chunks,
final chunks and non-streaming bodies of SGLang's OpenAI and ``/generate`` endpoints.
Separate from ``server`` because it is the one object both the engine (which fills it)
and the request handlers (which create and answer it) work on; it knows neither.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from aiohttp import web

from autotune.sim import text
from autotune.sim.prefix_cache import PrefixCache

_JSON_STRINGS: dict[str, bytes] = {}


def _json_str(text: str) -> bytes:
    """``json.dumps(text)`` as bytes, memoised: chunks repeat the same few token strings."""
    out = _JSON_STRINGS.get(text)
    if out is None:
        out = json.dumps(text).encode()
        if len(_JSON_STRINGS) < 65536:
            _JSON_STRINGS[text] = out
    return out


class Req:
    """One generation request, from arrival to its last written chunk."""

    __slots__ = (
        "seeded",
        "rid",
        "kind",
        "key",
        "n_prompt",
        "max_tokens",
        "ignore_eos",
        "stream",
        "include_usage",
        "resp",
        "done",
        "generated",
        "parts",
        "t_arrive",
        "t_first",
        "t_last",
        "prefix",
        "suffix",
        "finish",
        "prefilled",
        "model",
        "created",
        "transport",
        "unsent",
        "sent_at",
        "pages",
        "held",
        "cached",
        "matched",
        "report_cache",
    )

    def __init__(
        self,
        *,
        kind: str,
        prompt: str | list[int],
        max_tokens: int,
        ignore_eos: bool,
        stream: bool,
        include_usage: bool,
        model: str,
        cache: PrefixCache | None = None,
        report_cache: bool = False,
    ) -> None:
        self.rid = uuid.uuid4().hex
        self.seeded: bool | None = None
        """Decode: whether the prefill handed over draft state (ran EAGLE too); None: this
        server prefilled the request itself."""
        self.kind = kind
        self.key = text.prompt_key(prompt)
        self.pages: list[int] = []
        """Chain keys of the prompt's whole pages (with the radix cache on)."""
        if cache is not None:
            units = text.prompt_units(prompt)
            self.n_prompt = max(1, len(units))
            self.pages = cache.page_keys(units)
        else:
            self.n_prompt = text.prompt_tokens(prompt)
        self.held = 0  # pages of the prefix cache this request holds locked
        self.cached = 0  # prompt tokens served from the prefix cache (usage's cached_tokens)
        self.matched = False  # looked up in the prefix cache (at its first prefill chunk)
        self.report_cache = report_cache  # --enable-cache-report
        self.max_tokens = max_tokens
        self.ignore_eos = ignore_eos
        self.stream = stream
        self.include_usage = include_usage
        self.resp: web.StreamResponse | None = None
        self.transport: asyncio.Transport | None = None
        self.unsent = ""  # text generated but not yet streamed (--stream-interval > 1)
        self.sent_at = 0  # tokens generated when the last chunk was streamed
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.generated = 0
        self.parts: list[str] = []
        self.t_arrive = time.monotonic()
        self.t_first = 0.0
        self.t_last = 0.0
        self.finish: str | None = None
        self.prefilled = 0
        self.model = model
        self.created = int(time.time())
        self.prefix, self.suffix = self._templates()

    def _templates(self) -> tuple[bytes, bytes]:
        head = {"id": self.rid, "created": self.created, "model": self.model}
        if self.kind == "chat":
            head["object"] = "chat.completion.chunk"
            pre = json.dumps(head)[:-1] + ', "choices": [{"index": 0, "delta": {"content": '
            suf = '}, "logprobs": null, "finish_reason": null}]}\n\n'
        elif self.kind == "completion":
            head["object"] = "text_completion"
            pre = json.dumps(head)[:-1] + ', "choices": [{"index": 0, "text": '
            suf = ', "logprobs": null, "finish_reason": null}]}\n\n'
        else:  # /generate streams cumulative text
            pre = '{"text": '
            suf = "}\n\n"
        return b"data: " + pre.encode(), suf.encode()

    def usage(self) -> dict[str, Any]:
        """OpenAI usage; ``prompt_tokens_details.cached_tokens`` only with
        ``--enable-cache-report`` (SGLang's UsageProcessor)."""
        out: dict[str, Any] = {
            "prompt_tokens": self.n_prompt,
            "completion_tokens": self.generated,
            "total_tokens": self.n_prompt + self.generated,
        }
        if self.report_cache:
            out["prompt_tokens_details"] = {"cached_tokens": self.cached}
        return out

    def meta_usage(self) -> dict[str, int]:
        """``/generate``'s meta_info counts: SGLang always sends ``cached_tokens`` there."""
        return {
            "prompt_tokens": self.n_prompt,
            "completion_tokens": self.generated,
            "total_tokens": self.n_prompt + self.generated,
            "cached_tokens": self.cached,
        }

    def chunk(self, piece: str) -> bytes:
        if self.kind == "generate":
            return self.prefix + json.dumps("".join(self.parts)).encode() + self.suffix
        return self.prefix + _json_str(piece) + self.suffix

    def final_chunks(self) -> bytes:
        """Finish-reason chunk, usage chunk (if asked) and ``[DONE]``."""
        out: list[dict[str, Any]] = []
        finish = self.finish or "length"
        if self.kind == "generate":
            meta = {"id": self.rid, "finish_reason": {"type": finish}, **self.meta_usage()}
            out.append({"text": "".join(self.parts), "meta_info": meta})
        else:
            obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
            choice: dict[str, Any] = {
                "index": 0,
                "logprobs": None,
                "finish_reason": finish,
                "matched_stop": None,
            }
            if self.kind == "chat":
                choice["delta"] = {}
            else:
                choice["text"] = ""
            base: dict[str, Any] = {
                "id": self.rid,
                "object": obj,
                "created": self.created,
                "model": self.model,
            }
            out.append({**base, "choices": [choice]})
            if self.include_usage:
                out.append({**base, "choices": [], "usage": self.usage()})
        return (
            b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in out)
            + b"data: [DONE]\n\n"
        )

    def body(self) -> dict[str, Any]:
        """Non-streaming response body."""
        full = "".join(self.parts)
        finish = self.finish or "length"
        if self.kind == "generate":
            return {
                "text": full,
                "meta_info": {
                    "id": self.rid,
                    "finish_reason": {"type": finish, "length": self.generated},
                    **self.meta_usage(),
                    "e2e_latency": self.t_last - self.t_arrive,
                },
            }
        if self.kind == "chat":
            choice: dict[str, Any] = {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": full,
                    "reasoning_content": None,
                    "tool_calls": None,
                },
                "logprobs": None,
                "finish_reason": finish,
                "matched_stop": None,
            }
            obj = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": full,
                "logprobs": None,
                "finish_reason": finish,
                "matched_stop": None,
            }
            obj = "text_completion"
        return {
            "id": self.rid,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(),
        }
