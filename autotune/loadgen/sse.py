"""Incremental server-sent-events parser.

Network reads split a stream anywhere: inside a line, between ``\\r`` and ``\\n``, several
events in one read. :class:`SSEParser` turns such reads into whole events with as little
Python work per event as possible (one ``bytes.split`` per read, a prefix test per line), so
that one core keeps up with hundreds of streams. Payloads stay ``bytes``; the caller decides
which ones need ``json.loads``.

Follows the WHATWG event-stream rules (``data:`` lines joined by ``\\n``, one optional space
after the colon, ``:`` comments, ``\\r``/``\\n``/``\\r\\n`` line ends) with one deliberate
leniency: :meth:`SSEParser.close` also returns an event the stream did not terminate with a
blank line, because some servers end with ``data: [DONE]`` and no trailing blank line.
"""

from __future__ import annotations

from typing import NamedTuple

_DATA = b"data:"
_EVENT = b"event:"
_COLON = 58  # ord(":")
_SPACE = 32  # ord(" ")
_MAX_PENDING = 65536


class SSEEvent(NamedTuple):
    """One dispatched event: its data (lines joined by ``\\n``) and type (``b""`` if unnamed)."""

    data: bytes
    event: bytes = b""


class SSEParser:
    """Feed raw bytes, get complete events. One parser per stream."""

    __slots__ = ("_buf", "_data", "_event", "_skip_lf")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []
        self._event = b""
        self._skip_lf = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Events completed by ``chunk`` (possibly none, possibly several)."""
        if not chunk:
            return []
        if self._skip_lf:
            # The previous read ended with '\r': a leading '\n' completes that CRLF.
            self._skip_lf = False
            if chunk[0] == 10:
                chunk = chunk[1:]
                if not chunk:
                    return []
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:
            self._skip_lf = buf[-1] == 13
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if not self._data and not self._event:
            # Fast path: whole events; each "data: X" alone before its blank line is the
            # usual shape (one JSON object per event). The unfinished rest stays buffered.
            blocks = buf.split(b"\n\n")
            self._buf = blocks.pop()
            events: list[SSEEvent] = []
            for block in blocks:
                if block[:6] == b"data: " and b"\n" not in block:
                    events.append(SSEEvent(block[6:]))
                else:
                    events += self._lines([*block.split(b"\n"), b""])
            if len(self._buf) > _MAX_PENDING:
                # A long unfinished event: keep its complete lines as state instead of
                # re-splitting an ever longer buffer on every read.
                lines = self._buf.split(b"\n")
                self._buf = lines.pop()
                events += self._lines(lines)
            return events
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        if not lines:
            return []
        return self._lines(lines)

    def feed_data(self, chunk: bytes) -> list[bytes]:
        """:meth:`feed`, keeping only each event's data: the load generator's hot path.

        Usual reads (whole ``data: X`` events, no ``\\r``) cost one ``split`` and a prefix
        test per event, without building :class:`SSEEvent` objects.
        """
        if self._data or self._event or self._skip_lf or b"\r" in chunk:
            return [e.data for e in self.feed(chunk)]
        buf = self._buf + chunk if self._buf else chunk
        blocks = buf.split(b"\n\n")
        self._buf = blocks.pop()
        out: list[bytes] = []
        for block in blocks:
            if block[:6] == b"data: " and b"\n" not in block:
                out.append(block[6:])
            else:
                out += [e.data for e in self._lines([*block.split(b"\n"), b""])]
        if len(self._buf) > _MAX_PENDING:
            lines = self._buf.split(b"\n")
            self._buf = lines.pop()
            out += [e.data for e in self._lines(lines)]
        return out

    def close(self) -> list[SSEEvent]:
        """End of stream: the unterminated last line and event, if any (lenient)."""
        lines = [*self._buf.split(b"\n"), b""] if self._buf else [b""]
        self._buf = b""
        self._skip_lf = False
        return self._lines(lines)

    def _lines(self, lines: list[bytes]) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    payload = data[0] if len(data) == 1 else b"\n".join(data)
                    events.append(SSEEvent(payload, self._event))
                    data = self._data = []
                self._event = b""
            elif line.startswith(_DATA):
                value = line[5:]
                if value and value[0] == _SPACE:
                    value = value[1:]
                data.append(value)
            elif line[0] == _COLON:
                continue  # comment / keep-alive
            elif line.startswith(_EVENT):
                value = line[6:]
                self._event = value[1:] if value[:1] == b" " else value
            elif line == b"data":
                data.append(b"")  # field name without colon: empty value
            # id:, retry: and unknown fields carry nothing the load generator needs.
        return events
