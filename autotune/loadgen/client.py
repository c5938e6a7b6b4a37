"""The closed-loop streaming client: C workers, each on its own keep-alive connection.

Each worker sends its next request when its previous one finishes (closed loop), so the
server never sees more than C requests of ours. Warm-up requests run first and are
discarded (any warm-up error aborts: a server that cannot answer warm-up is not worth
measuring); then the measure phase runs by request count, by duration, or adaptively until
the throughput's confidence interval is tight enough (``target_rel_ci``). Warm-up and
measure are each hard-capped at ``max_duration_s``, every request at ``request_timeout_s``
in total, and the whole call at the caller's ``deadline``: nothing a server does (hang,
drip bytes, crash, garbage) keeps a trial waiting unboundedly.

Hot path: the HTTP framing is :mod:`autotune.loadgen.transport` (one callback per network
read); per read one ``perf_counter()``, one SSE split and one C-scanner JSON parse per
event. That is what lets one core follow 256 streams at tens of thousands of chunks/s.

Why one module of ~770 lines: the closed loop, its warm-up, the stop rules and the abort
hook run in one event loop over shared per-run state; the transport, records, metrics and
estimate it uses are modules of their own.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import math
from collections.abc import Awaitable, Callable, Coroutine
from json.scanner import c_make_scanner  # type: ignore[attr-defined]
from time import perf_counter, thread_time
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict

from autotune.errors import BenchError, BenchTimeout
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
from autotune.loadgen._steal import steal_seconds, steal_share
from autotune.loadgen.arrivals import ArrivalSchedule
from autotune.loadgen.datasets import (
    Prompt,
    build_prompts,
    load_tokenizer,
)
from autotune.loadgen.estimate import LiveEstimate, ThroughputTracker
from autotune.loadgen.metrics import Metrics, compute_metrics, with_client_load
from autotune.loadgen.pacer import Pacer
from autotune.loadgen.records import RequestRecord
from autotune.loadgen.spec import LoadSpec
from autotune.loadgen.sse import SSEParser
from autotune.loadgen.transport import Endpoint, WorkerConnection

PhaseCallback = Callable[[str], None]
ProgressCallback = Callable[[int, int], None]
AbortRule = Callable[[LiveEstimate], "str | None"]

ESTIMATE_INTERVAL_S = 0.25
"""How often the live estimate is updated (target check and ``abort_if``) while measuring."""
_DONE = b"[DONE]"
_TIMED_OUT = "timed out after"


def _unanswered(record: RequestRecord) -> bool:
    """The request ran out of time before the server sent a single token: the server is
    busy elsewhere (compiling, stuck), not refusing."""
    return not record.ok and not record.chunk_times and (record.error or "").startswith(_TIMED_OUT)


_SCAN = c_make_scanner(json.JSONDecoder()) if c_make_scanner else None
"""C JSON scanner without ``json.loads``' encoding detection and whitespace regex (2x faster)."""
_STREAM_HEADERS = {
    "Content-Type": JSON_HEADERS["content-type"],
    "Accept": JSON_HEADERS["accept"],
    "Accept-Encoding": "identity",
    "User-Agent": "autotune-loadgen",
}
_CONNECT_TIMEOUT_S = 10.0
_ERROR_BODY_BYTES = 4096


class BenchResult(BaseModel):
    """Measured records (warm-up excluded) and the metrics derived from them."""

    model_config = ConfigDict(extra="forbid")

    records: list[RequestRecord]
    metrics: Metrics
    warmup_seconds: float
    measure_seconds: float
    model: str
    stop_reason: str | None = None
    """Why the measure phase ended early or adaptively (``max_duration_s`` cap, failure
    streak, ``target CI reached``, ``aborted: ...``), if so."""
    aborted: str | None = None
    """The reason ``abort_if`` gave, when it cut the measure phase."""
    estimate: LiveEstimate | None = None
    """The last live estimate (throughput and its CI) when it was tracked
    (``target_rel_ci`` or ``abort_if`` given)."""


class _Bodies:
    """JSON request bodies, one per dispatch, in dataset order (deterministic in the seed).

    Prompts are built before a phase starts (:meth:`reserve`, outside any timing: building
    one costs up to a millisecond, which would show as send lag and steal the event loop
    from the streams); a phase that outruns its reservation builds more as it goes.
    """

    def __init__(self, spec: LoadSpec, model: str) -> None:
        self._spec = spec
        self._dataset = spec.requests_dataset
        self._tokenizer = load_tokenizer(spec.tokenizer)
        self._prompts: list[Prompt] = []
        self._first = 0
        """Index of ``_prompts[0]`` in the dataset."""
        self._next = 0
        self._ready: bytes | None = None
        self._base: dict[str, Any] = {
            "model": model,
            "temperature": spec.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if spec.ignore_eos is not None:  # a server that refuses unknown fields gets none
            self._base["ignore_eos"] = spec.ignore_eos

    def reserve(self, n: int) -> None:
        """Have the next ``n`` prompts built (those already sent are dropped)."""
        have = self._first + len(self._prompts)
        if self._next + n <= have:
            return
        kept = self._prompts[self._next - self._first :]
        spec = self._spec
        more = build_prompts(
            self._dataset,
            first=have,
            count=self._next + n - have,
            seed=spec.seed,
            form="token_ids" if spec.prompt == "token_ids" else "text",
            chat=spec.api == "chat",
            tokenizer=self._tokenizer,
        )
        self._prompts = kept + more
        self._first = self._next

    def prompt(self) -> Prompt:
        """The next request's prompt."""
        if self._next >= self._first + len(self._prompts):
            self.reserve(max(64, len(self._prompts)))
        p = self._prompts[self._next - self._first]
        self._next += 1
        return p

    def prefetch(self) -> None:
        """Render the next body now (the open loop does it while it waits for the next
        arrival, so a due request only has to be written)."""
        if self._ready is None:
            self._ready = self._render()

    def next(self) -> bytes:
        ready, self._ready = self._ready, None
        return ready if ready is not None else self._render()

    def _render(self) -> bytes:
        p = self.prompt()
        body = dict(self._base)
        body["max_tokens"] = p.output_tokens
        if self._spec.api == "chat":
            body["messages"] = (
                list(p.messages) if p.messages else [{"role": "user", "content": p.text}]
            )
        elif p.token_ids is not None:
            body["prompt"] = list(p.token_ids)
        else:
            body["prompt"] = p.text
        return json.dumps(body, separators=(",", ":")).encode()


def expected_requests(spec: LoadSpec) -> int:
    """About how many requests one measure phase of ``spec`` sends (prompts to build)."""
    if spec.requests is not None and spec.target_rel_ci is None:
        return spec.requests
    if spec.request_rate is not None:
        seconds = spec.duration_s or spec.max_duration_s
        return int(spec.request_rate * seconds * 1.2) + 16
    return max(256, 8 * spec.concurrency)


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


class _WarmupFailed(Exception):
    def __init__(self, record: RequestRecord) -> None:
        super().__init__(record.error)
        self.record = record


Prepare = Callable[[int, int, "float | None", "Pacer | None"], _Prepared]
"""(index, connection, due time, pacer) -> the request, ready to fire."""
"""Dispatch request ``index`` on connection ``conn``; ``due``: when the open loop's schedule
wanted it sent (``None`` in a closed loop)."""


class _Loop:
    """Shared state of a phase: records, stop rules, the failure streak, the end event.

    A subclass starts its tasks in :meth:`_start`; the phase ends when every task has
    finished (``_live`` reaches 0), when the hard deadline passes (in-flight requests
    cancelled), or at once when the live estimate's ``abort_if`` says so.
    """

    def __init__(
        self,
        *,
        count: int | None,
        dispatch_until: float | None,
        abort_on_error: bool,
        failure_streak: int,
        on_record: Callable[[RequestRecord], None] | None,
    ) -> None:
        self.count = count
        self.dispatch_until = dispatch_until
        self.abort_on_error = abort_on_error
        self.failure_streak = failure_streak
        self.on_record = on_record
        self.records: list[RequestRecord] = []
        self.next_index = 0
        self.streak = 0
        self.stop_reason: str | None = None
        self.stop_dispatch = False
        self.aborted: str | None = None
        self.error: BaseException | None = None
        self._end = asyncio.Event()
        self._live = 0
        self._tasks: set[asyncio.Future[None]] = set()

    def end(self) -> None:
        self._end.set()

    def _dispatching(self) -> bool:
        """Whether another request may be dispatched (stop rules not reached)."""
        if self.stop_reason is not None or self.stop_dispatch:
            return False
        if self.count is not None and self.next_index >= self.count:
            return False
        return self.dispatch_until is None or perf_counter() < self.dispatch_until

    def _settle(self, record: RequestRecord) -> None:
        """Keep a finished request and apply the failure rules."""
        self.records.append(record)
        if record.ok:
            self.streak = 0
        else:
            if self.abort_on_error:
                raise _WarmupFailed(record)
            self.streak += 1
            if self.streak >= self.failure_streak and self.stop_reason is None:
                self.stop_reason = f"stopped after {self.streak} consecutive failed requests"
        if self.on_record is not None:
            self.on_record(record)

    def _spawn(self, coro: Awaitable[None]) -> None:
        self._live += 1
        task = asyncio.ensure_future(self._guarded(coro))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guarded(self, coro: Awaitable[None]) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to run(), which re-raises it
            if self.error is None:
                self.error = exc
            self._end.set()
        finally:
            self._live -= 1
            if self._live <= 0:
                self._end.set()

    def _start(self) -> None:
        raise NotImplementedError

    async def run(
        self,
        *,
        hard_deadline: float,
        cap_reason: str,
        ticker: Callable[[], Awaitable[None]] | None = None,
    ) -> bool:
        """Run to completion or until ``hard_deadline`` (perf_counter); True when capped.

        Capping and aborting cancel in-flight requests (never recorded); capping sets
        ``stop_reason``. ``ticker`` runs alongside (the live estimate) and is cancelled
        at the end.
        """
        self._start()
        side = asyncio.ensure_future(self._guard(ticker)) if ticker is not None else None
        capped = False
        try:
            if self._live > 0:
                await asyncio.wait_for(self._end.wait(), max(hard_deadline - perf_counter(), 0.0))
        except asyncio.TimeoutError:
            capped = self.aborted is None
        finally:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()  # in-flight requests: cancelled, never recorded
            if side is not None:
                side.cancel()
            await asyncio.gather(*tasks, *([side] if side else []), return_exceptions=True)
        if self.error is not None:
            raise self.error
        self.records.sort(key=lambda r: r.index)
        if capped and self.stop_reason is None:
            self.stop_reason = f"{cap_reason}; in-flight requests cancelled"
        return capped

    async def _guard(self, ticker: Callable[[], Awaitable[None]]) -> None:
        try:
            await ticker()
        except Exception as exc:  # noqa: BLE001 - e.g. a failing abort_if: re-raised by run()
            self.error = exc
            self._end.set()


class _ClosedLoop(_Loop):
    """C workers sharing one dispatch counter; records land in completion order."""

    def __init__(self, prepare: Prepare, *, workers: int, **rules: Any) -> None:
        super().__init__(**rules)
        self.prepare = prepare
        self.workers = workers

    def _start(self) -> None:
        for w in range(self.workers):
            self._spawn(self._worker(w))

    async def _worker(self, worker_id: int) -> None:
        while self._dispatching():
            index = self.next_index
            self.next_index += 1
            self._settle(await self.prepare(index, worker_id, None, None).complete())


class _OpenLoop(_Loop):
    """Requests dispatched when the arrival schedule says, whether or not earlier ones
    have finished (``max_concurrency`` caps how many are in flight; a request waiting for
    a slot is due when the slot frees). Each in-flight request holds one pooled
    keep-alive connection.

    Timing: the dispatcher sleeps until ``SPIN_S`` before a request is due (asyncio's
    timers wake up to a millisecond late: epoll's resolution), prepares it (body rendered,
    connection opened), arms the :class:`~autotune.loadgen.pacer.Pacer` with it and yields
    to the event loop until it is due. Whichever sees it due first writes it: the dispatcher
    between two loop iterations, or any stream read between two callbacks of one iteration
    (a batched decode step makes every stream readable at once). ``PACE = False`` leaves the
    write to the dispatcher alone (``benchmarks/send_lag.py`` compares the two).
    """

    SPIN_S = 0.002
    PACE = True

    def __init__(
        self,
        prepare: Prepare,
        *,
        schedule: ArrivalSchedule,
        start: float,
        max_concurrency: int | None,
        prefetch: Callable[[], None] | None = None,
        **rules: Any,
    ) -> None:
        super().__init__(**rules)
        self.prefetch = prefetch
        self.prepare = prepare
        self.pacer = Pacer() if self.PACE else None
        self.schedule = schedule
        self.start = start
        self.slots = None if max_concurrency is None else asyncio.Semaphore(max_concurrency)
        self._free_since: collections.deque[float] = collections.deque(
            [-math.inf] * (max_concurrency or 0)
        )
        """When each free slot freed, oldest first: a request that had to wait for one is
        due when it freed (not when the schedule wanted it, which would count the wait as
        the client's lag)."""
        self._idle: list[int] = []
        self.connections = 0
        """Connections opened so far (the most requests in flight at once)."""

    def _start(self) -> None:
        self._spawn(self._dispatch())

    async def _dispatch(self) -> None:
        loop_time = perf_counter
        pacer = self.pacer
        while self._dispatching():
            index = self.next_index
            due = self.start + self.schedule.offset(index)
            if self.dispatch_until is not None and due >= self.dispatch_until:
                return
            if self.prefetch is not None:
                self.prefetch()
            wait = due - loop_time() - self.SPIN_S
            if wait > 0:
                await asyncio.sleep(wait)
            if self.slots is not None:
                await self.slots.acquire()
                due = max(due, self._free_since.popleft())
            if not self._dispatching():  # a stop rule fired while it waited
                self._release()
                return
            self.next_index += 1
            conn = self._idle.pop() if self._idle else self._open()
            request = self.prepare(index, conn, due, pacer)
            try:
                await request.conn.open_ahead()
                if pacer is not None:
                    pacer.arm(due, request.fire)
                while not request.fired and loop_time() < due:
                    await asyncio.sleep(0)
            except BaseException:
                if pacer is not None:
                    pacer.disarm()  # cancelled: nobody would await its answer
                raise
            if pacer is not None:
                pacer.fire()  # unless a stream read fired it already
            self._spawn(self._one(request.complete(), conn))

    def _release(self) -> None:
        if self.slots is not None:
            self._free_since.append(perf_counter())
            self.slots.release()

    def _open(self) -> int:
        self.connections += 1
        return self.connections - 1

    async def _one(self, pending: Awaitable[RequestRecord], conn: int) -> None:
        try:
            record = await pending
        finally:
            if isinstance(pending, Coroutine):
                pending.close()  # cancelled before it ran: no "never awaited" warning
            self._idle.append(conn)
            self._release()
        self._settle(record)


class _Adaptive:
    """The measure phase's live estimate: target-CI stop and ``abort_if``."""

    def __init__(
        self,
        spec: LoadSpec,
        tracker: ThroughputTracker,
        loop: _Loop,
        abort_if: AbortRule | None,
    ) -> None:
        self.spec = spec
        self.tracker = tracker
        self.loop = loop
        self.abort_if = abort_if
        self.last: LiveEstimate | None = None

    def update(self) -> LiveEstimate:
        self.last = self.tracker.estimate(perf_counter())
        return self.last

    async def tick(self) -> None:
        spec, loop = self.spec, self.loop
        min_requests = spec.requests or 0
        while True:
            await asyncio.sleep(ESTIMATE_INTERVAL_S)
            est = self.update()
            if est.elapsed_s < spec.min_duration_s:
                continue
            if self.abort_if is not None:
                reason = self.abort_if(est)
                if reason is not None:
                    loop.aborted = reason
                    loop.stop_reason = f"aborted: {reason}; in-flight requests cancelled"
                    loop.end()
                    return
            target = spec.target_rel_ci
            if (
                target is not None
                and not loop.stop_dispatch
                and est.completed >= min_requests
                and est.rel_half_width is not None
                and est.rel_half_width <= target
            ):
                loop.stop_dispatch = True  # in-flight requests finish and are measured
                loop.stop_reason = (
                    f"target CI reached: +/-{est.rel_half_width:.1%} after {est.elapsed_s:.1f} s"
                )
                if self.abort_if is None:
                    return


class LoadSession:
    """One server, a series of phases: model lookup, warm-up, then measure phases.

    A capacity search or a latency-throughput sweep measures several loads on the running
    server; they share the keep-alive connections, the model name and the prompt stream
    (each phase sends the prompts after the previous phase's, so a prefix cache does not
    see the same requests twice). ``deadline`` (``time.monotonic()``) caps every phase.
    Use as ``async with LoadSession(url, spec) as session``.
    """

    def __init__(self, url: str, spec: LoadSpec, *, deadline: float | None = None) -> None:
        self.base = base_url(url)
        self.spec = spec
        self.limit = Deadline(deadline)
        self.target = Endpoint(self.base)
        self._conns: list[WorkerConnection] = []
        self._bodies: _Bodies | None = None
        self._tracker: ThroughputTracker | None = None
        self.model = ""

    async def __aenter__(self) -> LoadSession:
        spec = self.spec
        try:
            self.model = spec.model or await _resolve_model(
                self._conn(0), self.target, self.base, spec.request_timeout_s, self.limit
            )
            self._bodies = _Bodies(spec, self.model)
        except BaseException:
            await self.__aexit__()  # no ``async with`` body ran: close what was opened
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        for conn in self._conns:
            conn.close()
        await asyncio.sleep(0)  # let the transports close their sockets now

    def _conn(self, i: int) -> WorkerConnection:
        while len(self._conns) <= i:
            timeout = min(self.spec.request_timeout_s, _CONNECT_TIMEOUT_S)
            self._conns.append(WorkerConnection(self.target, connect_timeout_s=timeout))
        return self._conns[i]

    def _preparer(self, spec: LoadSpec) -> Prepare:
        path = endpoint(spec.api)
        chat = spec.api == "chat"

        def prepare(index: int, conn: int, due: float | None, pacer: Pacer | None) -> _Prepared:
            assert self._bodies is not None
            body = self._bodies.next()
            return _prepare(
                self._conn(conn),
                self.target.request_head("POST", path, _STREAM_HEADERS, len(body)) + body,
                index=index,
                timeout_s=spec.request_timeout_s,
                chat=chat,
                base=self.base,
                tracker=self._tracker,
                require_done=spec.require_done,
                due=due,
                pacer=pacer,
            )

        return prepare

    async def warm_up(self, *, on_phase: PhaseCallback | None = None) -> float:
        """The session's discarded warm-up requests; seconds taken."""
        assert self._bodies is not None
        self._bodies.reserve(self.spec.warmup_requests or 0)
        return await _warm_up(self.spec, self._preparer(self.spec), self.base, self.limit, on_phase)

    async def measure(
        self,
        spec: LoadSpec | None = None,
        *,
        on_progress: ProgressCallback | None = None,
        abort_if: AbortRule | None = None,
    ) -> BenchResult:
        """One measure phase of ``spec`` (the session's own by default); see :func:`arun_load`."""
        spec = spec or self.spec
        base, limit = self.base, self.limit
        assert self._bodies is not None
        self._bodies.reserve(expected_requests(spec))
        total = spec.requests or 0
        adaptive = spec.target_rel_ci is not None
        t0 = perf_counter()
        cpu0 = thread_time()
        steal0 = steal_seconds()
        tracker = self._tracker = (
            ThroughputTracker(t0) if adaptive or abort_if is not None else None
        )

        def on_record(record: RequestRecord) -> None:
            if tracker is not None:
                tracker.finish(record)
            if on_progress is not None:
                on_progress(len(loop.records), total)

        rules: dict[str, Any] = {
            "count": None if adaptive else spec.requests,
            "dispatch_until": None if spec.duration_s is None else t0 + spec.duration_s,
            "abort_on_error": False,
            "failure_streak": max(4 * (spec.max_concurrency or spec.concurrency), 64),
            "on_record": on_record,
        }
        loop: _Loop
        if spec.request_rate is None:
            loop = _ClosedLoop(self._preparer(spec), workers=spec.streams, **rules)
        else:
            schedule = ArrivalSchedule(
                rate=spec.request_rate, burstiness=spec.burstiness, seed=spec.seed
            )
            loop = _OpenLoop(
                self._preparer(spec),
                schedule=schedule,
                start=t0,
                max_concurrency=spec.max_concurrency,
                prefetch=self._bodies.prefetch,
                **rules,
            )
        live = None if tracker is None else _Adaptive(spec, tracker, loop, abort_if)
        cap = t0 + spec.max_duration_s
        by_deadline = limit.at is not None and limit.at < cap
        reason = "trial deadline reached" if by_deadline else "max_duration_s reached"
        # No cyclic garbage collection while measuring: a full collection over thousands of
        # records (a float per chunk) stalls the event loop for milliseconds, which shows
        # as send lag and as latency. The phase is bounded; collection resumes after it.
        collecting = gc.isenabled()
        gc.disable()
        try:
            await loop.run(
                hard_deadline=limit.earliest(cap),
                cap_reason=reason,
                ticker=None if live is None else live.tick,
            )
        finally:
            self._tracker = None
            if collecting:
                gc.enable()
        records = loop.records
        measure_seconds = perf_counter() - t0
        cpu_share = (thread_time() - cpu0) / measure_seconds if measure_seconds > 0 else None
        stolen = steal_share(steal0, steal_seconds(), measure_seconds)
        estimate = None if live is None else live.update()

        if not records:
            within = f"within max_duration_s={spec.max_duration_s:g}"
            if by_deadline:
                within = "before the trial deadline"
            if loop.aborted is not None:
                raise BenchError(
                    f"no request to {base} completed before the measure phase was aborted "
                    f"({loop.aborted})"
                )
            raise BenchTimeout(f"no request to {base} completed {within}")
        failures = [r for r in records if not r.ok]
        if len(failures) == len(records):
            raise (BenchTimeout if all(map(_unanswered, records)) else BenchError)(
                f"all {len(records)} measured requests to {base} failed; first error: "
                f"{failures[0].error}"
            )
        duration = max(r.end_time for r in records) - min(r.send_time for r in records)
        metrics = compute_metrics(records, duration_s=duration, slo=spec.slo)
        metrics = with_client_load(metrics, spec, cpu_share=cpu_share, steal_share=stolen)
        return BenchResult(
            records=records,
            metrics=metrics,
            warmup_seconds=0.0,
            measure_seconds=measure_seconds,
            model=self.model,
            stop_reason=loop.stop_reason,
            aborted=loop.aborted,
            estimate=estimate,
        )


async def arun_load(
    url: str,
    spec: LoadSpec,
    *,
    on_phase: PhaseCallback | None = None,
    on_progress: ProgressCallback | None = None,
    deadline: float | None = None,
    abort_if: AbortRule | None = None,
) -> BenchResult:
    """Warm up, then measure ``spec`` against the OpenAI-compatible server at ``url``.

    ``on_phase`` gets ``"warmup"`` and ``"measure"``; ``on_progress(done, total)`` gets the
    measured requests finished so far (``total`` is ``spec.requests``, 0 in duration mode).
    ``deadline`` (a ``time.monotonic()`` instant) caps the whole call: reached before or
    during warm-up it raises, during measure it stops like ``max_duration_s`` and keeps
    what was measured. With ``spec.target_rel_ci`` the measure phase stops dispatching
    once the throughput's 95% CI is that tight (never before ``min_duration_s`` nor
    ``requests`` completions) and lets in-flight requests finish. ``abort_if`` is called
    with each live estimate (every ``ESTIMATE_INTERVAL_S``) once ``min_duration_s`` of
    measure time has passed; a string ends the measure phase at once (in-flight requests
    cancelled) and becomes ``BenchResult.aborted``. Every request is limited to
    ``request_timeout_s`` in total and warm-up to ``max_duration_s``, so this returns in
    bounded time whatever the server does. Raises :class:`BenchError` (and nothing else
    for any server behaviour) when the server is unreachable, warm-up fails, or nothing
    succeeded.

    Closed loop (``request_rate`` unset): ``spec.streams`` workers, each sending its next
    request when its last one finished. Open loop: requests sent on the arrival schedule
    (:mod:`autotune.loadgen.arrivals`), at most ``max_concurrency`` in flight if set.
    """
    async with LoadSession(url, spec, deadline=deadline) as session:
        warmup_seconds = await session.warm_up(on_phase=on_phase)
        if on_phase:
            on_phase("measure")
        result = await session.measure(on_progress=on_progress, abort_if=abort_if)
    return result.model_copy(update={"warmup_seconds": warmup_seconds})


async def _warm_up(
    spec: LoadSpec,
    prepare: Prepare,
    base: str,
    limit: Deadline,
    on_phase: PhaseCallback | None,
) -> float:
    """Run the discarded warm-up requests (a closed loop, also before an open-loop
    measurement: it only has to compile and fill caches); seconds taken. Any failure
    raises BenchError."""
    n_warm = spec.warmup_requests or 0
    if not n_warm:
        return 0.0
    if on_phase:
        on_phase("warmup")
    t0 = perf_counter()
    warm = _ClosedLoop(
        prepare,
        workers=min(spec.max_concurrency or spec.concurrency, n_warm),
        count=n_warm,
        dispatch_until=None,
        abort_on_error=True,
        failure_streak=n_warm,
        on_record=None,
    )
    cap = t0 + spec.max_duration_s
    try:
        capped = await warm.run(hard_deadline=limit.earliest(cap), cap_reason="warm-up cap")
    except _WarmupFailed as exc:
        error = BenchTimeout if _unanswered(exc.record) else BenchError
        raise error(f"warm-up request to {base} failed: {exc.record.error}") from None
    seconds = perf_counter() - t0
    if capped:
        done = sum(r.ok for r in warm.records)
        why = (
            "trial deadline reached during warm-up"
            if limit.at is not None and limit.at < cap
            else f"warm-up did not finish within max_duration_s={spec.max_duration_s:g}"
        )
        raise BenchTimeout(
            f"{why} ({done} of {n_warm} warm-up requests to {base} finished in {seconds:.1f} s)"
        )
    return seconds


class _Collect:
    """Body sink of a plain (non-streamed) answer: status, headers and up to 1 MiB."""

    __slots__ = ("status", "headers", "body")

    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = bytearray()

    def head(self, status: int, headers: dict[str, str]) -> None:
        self.status, self.headers = status, headers

    def data(self, chunk: bytes) -> bool:
        self.body += chunk
        return len(self.body) > 2**20


async def _resolve_model(
    conn: WorkerConnection, target: Endpoint, base: str, timeout_s: float, limit: Deadline
) -> str:
    """The served model's name from ``GET /v1/models``, within ``timeout_s`` in total.

    Asked on the first worker's connection, which that worker then keeps using.
    """
    wait, by_deadline = limit.cap(timeout_s)
    if by_deadline and wait <= 0:
        raise BenchError(f"trial deadline reached before the load on {base} started")
    sink = _Collect()
    request = target.request_head("GET", "/v1/models", {"Accept": "application/json"}, 0)
    try:
        await asyncio.wait_for(conn.exchange(request, sink), wait)
    except asyncio.TimeoutError:
        if by_deadline:
            raise BenchError(
                f"trial deadline reached while asking {base}/v1/models for the model name"
            ) from None
        raise BenchError(f"GET {base}/v1/models timed out after {wait:g} s") from None
    except httpx.ConnectError as exc:
        raise BenchError(f"server unreachable: {unreachable(base, exc)}") from None
    except (httpx.HTTPError, OSError) as exc:
        raise BenchError(f"GET {base}/v1/models failed: {connection_error(base, exc)}") from None
    resp = httpx.Response(sink.status, headers=sink.headers, content=bytes(sink.body))
    return model_from_listing(resp, base)


def run_load(
    url: str,
    spec: LoadSpec,
    *,
    on_phase: PhaseCallback | None = None,
    on_progress: ProgressCallback | None = None,
    deadline: float | None = None,
    abort_if: AbortRule | None = None,
) -> BenchResult:
    """Synchronous :func:`arun_load` (own event loop; call ``arun_load`` from async code)."""
    out: list[BenchResult] = []

    async def main() -> None:
        # The result is handed over outside the task: on Python 3.11, asyncio.run formats
        # the main task's repr (result included: every record) when it restores SIGINT.
        out.append(
            await arun_load(
                url,
                spec,
                on_phase=on_phase,
                on_progress=on_progress,
                deadline=deadline,
                abort_if=abort_if,
            )
        )

    asyncio.run(main())
    return out[0]
