"""The body sink of one streamed request: SSE events -> chunk times, generated text, usage.

The hot path: :mod:`autotune.loadgen.transport` calls :meth:`_Stream.data` once per network
read; per read one ``perf_counter()``, one SSE split and one C-scanner JSON parse per event
(and, in an open loop, one clock check for the pacer's due write). It also says what is wrong
with an answer that is not a completion stream (not JSON, an unexpected shape, an error event,
no ``[DONE]``), so nothing a server sends escapes as an exception. Apart from the request's
send and record (:mod:`._request`): it only parses bytes, and is tested without a connection.
"""

from __future__ import annotations

import json
from json.scanner import c_make_scanner  # type: ignore[attr-defined]
from time import perf_counter
from typing import Any

from autotune.loadgen._http import error_text, snippet
from autotune.loadgen.estimate import ThroughputTracker
from autotune.loadgen.pacer import Pacer
from autotune.loadgen.sse import SSEParser

_DONE = b"[DONE]"
_SCAN = c_make_scanner(json.JSONDecoder()) if c_make_scanner else None
"""C JSON scanner without ``json.loads``' encoding detection and whitespace regex (2x faster)."""
_ERROR_BODY_BYTES = 4096


class _Attempt:
    """Mutable state of one request, kept outside the task so a timeout keeps partial data."""

    __slots__ = (
        "chunk_times",
        "pieces",
        "prompt_tokens",
        "completion_tokens",
        "status",
        "error",
        "done_time",
    )

    def __init__(self) -> None:
        self.chunk_times: list[float] = []
        self.pieces: list[str] = []
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.status: int | None = None
        self.error: str | None = None
        self.done_time: float | None = None


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _Malformed(Exception):
    """An event that is valid SSE but not a completion chunk; the text says what is wrong."""


def _text_of(obj: Any, chat: bool) -> str | None:
    """Generated text of one parsed chunk; :class:`_Malformed` for shapes no server sends."""
    if type(obj) is not dict:
        raise _Malformed(f"event is {type(obj).__name__}, not an object")
    choices = obj.get("choices")
    if not choices:
        return None
    if type(choices) is not list:
        raise _Malformed(f"'choices' is {type(choices).__name__}, not a list")
    c0 = choices[0]
    if type(c0) is not dict:
        raise _Malformed(f"'choices[0]' is {type(c0).__name__}, not an object")
    if chat:
        delta = c0.get("delta") or {}
        if type(delta) is not dict:
            raise _Malformed(f"'delta' is {type(delta).__name__}, not an object")
        text = delta.get("content") or delta.get("reasoning_content")
    else:
        text = c0.get("text")
    if text and type(text) is not str:
        raise _Malformed(f"generated text is {type(text).__name__}, not a string")
    return text  # type: ignore[no-any-return]


class _Stream:
    """The body sink of one streamed request: SSE events -> chunk times, text, usage."""

    __slots__ = (
        "att", "chat", "parser", "first", "ctype", "err_body", "tracker", "require_done",
        "finished", "pacer",
    )  # fmt: skip

    def __init__(
        self,
        att: _Attempt,
        chat: bool,
        tracker: ThroughputTracker | None,
        *,
        require_done: bool = True,
        pacer: Pacer | None = None,
    ) -> None:
        self.pacer = pacer
        """The open loop's armed write, fired from here when it falls due (:mod:`.pacer`)."""
        self.att = att
        self.require_done = require_done
        self.finished = False
        """A choice carried a ``finish_reason`` (the generation ended)."""
        self.chat = chat
        self.parser = SSEParser()
        self.first = b""
        self.ctype = "none"
        self.err_body: bytearray | None = None
        self.tracker = tracker

    def head(self, status: int, headers: dict[str, str]) -> None:
        self.att.status = status
        self.ctype = headers.get("content-type", "none")
        if status != 200:
            self.err_body = bytearray()

    def data(self, raw: bytes) -> bool:
        """One network read of body bytes; True stops the response (an error is recorded)."""
        now = perf_counter()
        pacer = self.pacer
        if pacer is not None and now >= pacer.due:
            pacer.fire_from_read()
        if self.err_body is not None:
            if len(self.err_body) < _ERROR_BODY_BYTES:
                self.err_body += raw
            return False
        att = self.att
        if att.done_time is not None:
            return False  # after [DONE]: the rest is drained so the connection is reused
        if not self.first:
            self.first = raw
        texts = 0
        data = b""
        try:
            for data in self.parser.feed_data(raw):
                if not data:
                    continue
                if data == _DONE:
                    att.done_time = now
                    break
                try:
                    obj = _SCAN(data.decode(), 0)[0] if _SCAN else json.loads(data)
                except (ValueError, StopIteration, RecursionError):
                    raise _Malformed("not JSON") from None
                if type(obj) is dict and obj.get("error") is not None:
                    att.error = f"server error: {error_text(obj['error'])}"
                    return True
                text = _text_of(obj, self.chat)
                if not self.require_done and not self.finished:
                    choices = obj.get("choices")
                    self.finished = bool(
                        choices and type(choices[0]) is dict and choices[0].get("finish_reason")
                    )
                if text:
                    att.chunk_times.append(now)
                    att.pieces.append(text)
                    texts += 1
                usage = obj.get("usage")
                if usage:
                    if type(usage) is not dict:
                        raise _Malformed(f"'usage' is {type(usage).__name__}, not an object")
                    att.prompt_tokens = _int_or_none(usage.get("prompt_tokens"))
                    att.completion_tokens = _int_or_none(usage.get("completion_tokens"))
        except _Malformed as exc:
            att.error = f"malformed event ({exc}): {snippet(data)}"
            return True
        finally:
            if texts and self.tracker is not None:
                self.tracker.chunks(now, texts)
        return False

    def finish(self) -> None:
        """The response ended (cleanly): settle ``[DONE]`` and the error, if any."""
        att = self.att
        if self.err_body is not None:
            att.error = f"HTTP {att.status}: {snippet(bytes(self.err_body))}"
            return
        if att.error is not None or att.done_time is not None:
            return
        now = perf_counter()
        for data, _event in self.parser.close():
            if data == _DONE and att.done_time is None:
                att.done_time = now
        if att.done_time is None and self.finished:
            att.done_time = now  # no [DONE] required: the body ended after a finish_reason
        if att.done_time is None:
            att.error = "stream ended before 'data: [DONE]'"
            if not self.first:
                att.error += " (empty body)"
            elif not att.pieces and not self.first.lstrip().startswith((b"data", b":", b"event")):
                att.error += (
                    f" (not an event stream: content-type {self.ctype}; {snippet(self.first)})"
                )
