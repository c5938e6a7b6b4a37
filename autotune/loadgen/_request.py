"""One streamed request from written to recorded.

:class:`_Prepared` holds a request ready to go (body rendered, :class:`~._stream._Stream` sink
made) and writes it on :meth:`~_Prepared.fire`; :func:`_complete` waits for the answer under the
total ``request_timeout_s`` limit, turns every way it can fail into the record's error and gives
the :class:`~autotune.loadgen.records.RequestRecord`. The loops dispatch through a
:data:`Prepare` callable that the session makes; :func:`_unanswered` tells a request that timed
out before its first token (a busy server) from one that failed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from time import perf_counter

import httpx

from autotune.loadgen._http import connection_error
from autotune.loadgen._stream import _Attempt, _Stream
from autotune.loadgen.estimate import ThroughputTracker
from autotune.loadgen.pacer import Pacer
from autotune.loadgen.records import RequestRecord
from autotune.loadgen.transport import WorkerConnection

_TIMED_OUT = "timed out after"


def _unanswered(record: RequestRecord) -> bool:
    """The request ran out of time before the server sent a single token: the server is
    busy elsewhere (compiling, stuck), not refusing."""
    return not record.ok and not record.chunk_times and (record.error or "").startswith(_TIMED_OUT)


class _Prepared:
    """One streamed request ready to go: body rendered, sink made; :meth:`fire` writes it
    (on its open keep-alive connection at once), :meth:`complete` gives its record."""

    __slots__ = (
        "conn",
        "request",
        "stream",
        "index",
        "timeout_s",
        "base",
        "due",
        "send",
        "started",
    )

    def __init__(
        self,
        conn: WorkerConnection,
        request: bytes,
        stream: _Stream,
        *,
        index: int,
        timeout_s: float,
        base: str,
        due: float | None,
    ) -> None:
        self.conn, self.request, self.stream = conn, request, stream
        self.index, self.timeout_s, self.base, self.due = index, timeout_s, base, due
        self.send: float | None = None
        self.started: asyncio.Future[None] | None = None

    @property
    def fired(self) -> bool:
        return self.send is not None

    def fire(self) -> None:
        """Write the request now (once); a connection still to open is opened and written by
        :meth:`complete`."""
        if self.send is None:
            self.send = perf_counter()
            self.started = self.conn.start_now(self.request, self.stream)

    def complete(self) -> Awaitable[RequestRecord]:
        self.fire()
        assert self.send is not None
        return _complete(
            self.conn,
            self.request,
            self.stream,
            self.started,
            send=self.send,
            index=self.index,
            timeout_s=self.timeout_s,
            base=self.base,
            due=self.due,
        )


def _prepare(
    conn: WorkerConnection,
    request: bytes,
    *,
    index: int,
    timeout_s: float,
    chat: bool,
    base: str,
    tracker: ThroughputTracker | None,
    require_done: bool = True,
    due: float | None = None,
    pacer: Pacer | None = None,
) -> _Prepared:
    """One streamed request, not written yet (see :class:`_Prepared`)."""
    stream = _Stream(_Attempt(), chat, tracker, require_done=require_done, pacer=pacer)
    return _Prepared(conn, request, stream, index=index, timeout_s=timeout_s, base=base, due=due)


async def _complete(
    conn: WorkerConnection,
    request: bytes,
    stream: _Stream,
    started: asyncio.Future[None] | None,
    *,
    send: float,
    index: int,
    timeout_s: float,
    base: str,
    due: float | None,
) -> RequestRecord:
    att = stream.att
    try:
        # A total limit: a server that drips one byte a second must not hold the request.
        work = conn.exchange(request, stream) if started is None else conn.finish(started, stream)
        await asyncio.wait_for(work, timeout_s)
        stream.finish()
    except asyncio.TimeoutError:
        att.error = f"{_TIMED_OUT} {timeout_s:g} s (request_timeout_s)"
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        att.error = connection_error(base, exc)
    except (httpx.HTTPError, OSError) as exc:
        att.error = connection_error(base, exc)
    except Exception as exc:  # noqa: BLE001 - one odd answer must not end the whole run
        att.error = f"unexpected {type(exc).__name__} handling the answer: {exc}"
    if att.done_time is not None:
        att.error = None  # [DONE] arrived: a problem while draining does not spoil the answer
        end = att.done_time
    else:
        end = perf_counter()
    return RequestRecord.model_construct(
        index=index,
        send_time=send,
        due_time=due,
        end_time=end,
        chunk_times=att.chunk_times,
        prompt_tokens=att.prompt_tokens,
        completion_tokens=att.completion_tokens,
        status=att.status,
        error=att.error,
        text="".join(att.pieces),
    )


Prepare = Callable[[int, int, "float | None", "Pacer | None"], _Prepared]
"""(index, connection, due time, pacer) -> the request, ready to fire."""
"""Dispatch request ``index`` on connection ``conn``; ``due``: when the open loop's schedule
wanted it sent (``None`` in a closed loop)."""
