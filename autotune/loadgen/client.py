"""The closed-loop streaming client: C workers over one keep-alive httpx client.

Each worker sends its next request when its previous one finishes (closed loop), so the
server never sees more than C requests of ours. Warm-up requests run first and are
discarded (any warm-up error aborts: a server that cannot answer warm-up is not worth
measuring); then the measure phase runs by request count or by duration. Warm-up and
measure are each hard-capped at ``max_duration_s``, every request at ``request_timeout_s``
in total, and the whole call at the caller's ``deadline``: nothing a server does (hang,
drip bytes, crash, garbage) keeps a trial waiting unboundedly. The hot path per network
read is one ``perf_counter()``, one SSE split and one ``json.loads`` per event.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from json.scanner import c_make_scanner  # type: ignore[attr-defined]
from time import perf_counter
from typing import Any

import httpx
import numpy as np
from pydantic import BaseModel, ConfigDict

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
from autotune.loadgen.metrics import Metrics, compute_metrics
from autotune.loadgen.records import RequestRecord
from autotune.loadgen.spec import LoadSpec
from autotune.loadgen.sse import SSEParser
from autotune.loadgen.transport import WORKER, WorkerTransport

PhaseCallback = Callable[[str], None]
ProgressCallback = Callable[[int, int], None]

TOKEN_ID_RANGE = (1000, 30000)
"""Random prompt token ids stay inside every common vocabulary and away from specials."""
_WORD_TEXT = (
    "time person year way day thing man world life hand part child eye woman place work "
    "week case point government company number group problem fact water room mother area "
    "money story month lot right study book word business issue side kind head house "
    "service friend father power hour game line end member law car city community name "
    "president team minute idea kid body information back parent face others level office "
    "door health art war history party result change morning reason research girl guy "
    "moment air teacher force education river stone light garden music cloud paper"
)
_WORDS = _WORD_TEXT.split()
_DONE = b"[DONE]"
_SCAN = c_make_scanner(json.JSONDecoder()) if c_make_scanner else None
"""C JSON scanner without ``json.loads``' encoding detection and whitespace regex (2x faster)."""
_STREAM_HEADERS = {**JSON_HEADERS, "accept-encoding": "identity"}
_CONNECT_TIMEOUT_S = 10.0


class BenchResult(BaseModel):
    """Measured records (warm-up excluded) and the metrics derived from them."""

    model_config = ConfigDict(extra="forbid")

    records: list[RequestRecord]
    metrics: Metrics
    warmup_seconds: float
    measure_seconds: float
    model: str
    stop_reason: str | None = None
    """Why the measure phase ended early (``max_duration_s`` cap, failure streak), if so."""


class _Bodies:
    """JSON request bodies, one per dispatch, deterministic in ``spec.seed``."""

    def __init__(self, spec: LoadSpec, model: str) -> None:
        self._rng = np.random.default_rng(spec.seed)
        self._spec = spec
        self._base: dict[str, Any] = {
            "model": model,
            "max_tokens": spec.output_len,
            "temperature": spec.temperature,
            "ignore_eos": spec.ignore_eos,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    def next(self) -> bytes:
        n = self._spec.input_len
        body = dict(self._base)
        if self._spec.prompt == "token_ids":
            body["prompt"] = self._rng.integers(*TOKEN_ID_RANGE, size=n).tolist()
        else:
            idx = self._rng.integers(0, len(_WORDS), size=n)
            text = " ".join([_WORDS[i] for i in idx])
            if self._spec.api == "chat":
                body["messages"] = [{"role": "user", "content": text}]
            else:
                body["prompt"] = text
        return json.dumps(body, separators=(",", ":")).encode()


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


async def _stream(
    client: httpx.AsyncClient, path: str, body: bytes, att: _Attempt, chat: bool
) -> None:
    async with client.stream("POST", path, content=body, headers=_STREAM_HEADERS) as resp:
        att.status = resp.status_code
        if resp.status_code != 200:
            att.error = f"HTTP {resp.status_code}: {snippet(await resp.aread())}"
            return
        parser = SSEParser()
        feed = parser.feed
        times = att.chunk_times
        pieces = att.pieces
        scan = _SCAN
        data = b""
        first = b""
        try:
            async for raw in resp.aiter_raw():  # identity encoding requested: raw == body
                now = perf_counter()
                if not first:
                    first = raw
                for data, _event in feed(raw):
                    if att.done_time is not None or not data:
                        continue  # drain after [DONE] so the connection is reused
                    if data == _DONE:
                        att.done_time = now
                        continue
                    try:
                        obj = scan(data.decode(), 0)[0] if scan else json.loads(data)
                    except (ValueError, StopIteration, RecursionError):
                        raise _Malformed("not JSON") from None
                    if type(obj) is dict:
                        err = obj.get("error")
                        if err is not None:
                            att.error = f"server error: {error_text(err)}"
                            return
                    text = _text_of(obj, chat)
                    if text:
                        times.append(now)
                        pieces.append(text)
                    usage = obj.get("usage")
                    if usage:
                        if type(usage) is not dict:
                            raise _Malformed(f"'usage' is {type(usage).__name__}, not an object")
                        att.prompt_tokens = _int_or_none(usage.get("prompt_tokens"))
                        att.completion_tokens = _int_or_none(usage.get("completion_tokens"))
            now = perf_counter()
            for data, _event in parser.close():
                if data == _DONE and att.done_time is None:
                    att.done_time = now
        except _Malformed as exc:
            att.error = f"malformed event ({exc}): {snippet(data)}"
            return
        if att.done_time is None:
            att.error = "stream ended before 'data: [DONE]'"
            if not first:
                att.error += " (empty body)"
            elif not pieces and not first.lstrip().startswith((b"data", b":", b"event")):
                ctype = resp.headers.get("content-type", "none")
                att.error += f" (not an event stream: content-type {ctype}; {snippet(first)})"


async def _request(
    client: httpx.AsyncClient,
    *,
    path: str,
    body: bytes,
    index: int,
    timeout_s: float,
    chat: bool,
    base: str,
) -> RequestRecord:
    att = _Attempt()
    send = perf_counter()
    try:
        # A total limit: httpx's read timeout restarts with every byte, so a server that
        # drips one byte a second would otherwise hold the request forever.
        await asyncio.wait_for(_stream(client, path, body, att, chat), timeout_s)
    except asyncio.TimeoutError:
        att.error = f"timed out after {timeout_s:g} s (request_timeout_s)"
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        att.error = connection_error(base, exc)
    except httpx.TimeoutException as exc:
        att.error = f"{type(exc).__name__} after {timeout_s:g} s: {exc or 'no detail'}"
    except (httpx.HTTPError, OSError) as exc:
        att.error = connection_error(base, exc)
    except Exception as exc:  # noqa: BLE001 - one odd answer must not end the whole run
        att.error = f"unexpected {type(exc).__name__} handling the answer: {exc}"
    if att.done_time is not None:
        att.error = None  # [DONE] arrived: a problem while draining does not spoil the answer
        end = att.done_time
    else:
        end = perf_counter()
    return RequestRecord(
        index=index,
        send_time=send,
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


class _ClosedLoop:
    """C workers sharing one dispatch counter; records land in completion order."""

    def __init__(
        self,
        send: Callable[[int], Awaitable[RequestRecord]],
        *,
        count: int | None,
        dispatch_until: float | None,
        abort_on_error: bool,
        failure_streak: int,
        on_record: Callable[[int], None] | None,
    ) -> None:
        self.send = send
        self.count = count
        self.dispatch_until = dispatch_until
        self.abort_on_error = abort_on_error
        self.failure_streak = failure_streak
        self.on_record = on_record
        self.records: list[RequestRecord] = []
        self.next_index = 0
        self.streak = 0
        self.stop_reason: str | None = None

    async def worker(self, worker_id: int) -> None:
        WORKER.set(worker_id)  # this task's requests use this worker's own connection
        while self.stop_reason is None:
            if self.count is not None and self.next_index >= self.count:
                return
            if self.dispatch_until is not None and perf_counter() >= self.dispatch_until:
                return
            index = self.next_index
            self.next_index += 1
            record = await self.send(index)
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
                self.on_record(len(self.records))

    async def run(self, workers: int, *, hard_deadline: float, cap_reason: str) -> bool:
        """Run to completion or until ``hard_deadline`` (perf_counter); True when capped.

        Capping cancels in-flight requests (never recorded) and sets ``stop_reason``.
        """
        tasks = [asyncio.ensure_future(self.worker(w)) for w in range(workers)]
        timeout = max(hard_deadline - perf_counter(), 0.0)
        try:
            done, pending = await asyncio.wait(
                tasks, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION
            )
        finally:
            for task in tasks:
                task.cancel()  # in-flight requests: cancelled, never recorded
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            exc = task.exception()
            if exc is not None:
                raise exc
        self.records.sort(key=lambda r: r.index)
        if pending and self.stop_reason is None:
            self.stop_reason = f"{cap_reason}; in-flight requests cancelled"
        return bool(pending)


async def arun_load(
    url: str,
    spec: LoadSpec,
    *,
    on_phase: PhaseCallback | None = None,
    on_progress: ProgressCallback | None = None,
    deadline: float | None = None,
) -> BenchResult:
    """Warm up, then measure ``spec`` against the OpenAI-compatible server at ``url``.

    ``on_phase`` gets ``"warmup"`` and ``"measure"``; ``on_progress(done, total)`` gets the
    measured requests finished so far (``total`` is 0 in duration mode). ``deadline`` (a
    ``time.monotonic()`` instant) caps the whole call: reached before or during warm-up it
    raises, during measure it stops like ``max_duration_s`` and keeps what was measured.
    Every request is limited to ``request_timeout_s`` in total and warm-up to
    ``max_duration_s``, so this returns in bounded time whatever the server does. Raises
    :class:`BenchError` (and nothing else for any server behaviour) when the server is
    unreachable, warm-up fails, or nothing succeeded.
    """
    base = base_url(url)
    limit = Deadline(deadline)
    c = spec.concurrency
    rt = spec.request_timeout_s
    timeout = httpx.Timeout(connect=min(rt, _CONNECT_TIMEOUT_S), read=rt, write=rt, pool=rt)
    transport = WorkerTransport(c)  # C keep-alive connections, one per worker
    async with httpx.AsyncClient(
        base_url=base, transport=transport, timeout=timeout, trust_env=False
    ) as client:
        model = spec.model or await _resolve_model(client, base, spec.request_timeout_s, limit)
        bodies = _Bodies(spec, model)
        path = endpoint(spec.api)
        chat = spec.api == "chat"

        def send(index: int) -> Awaitable[RequestRecord]:
            return _request(
                client,
                path=path,
                body=bodies.next(),
                index=index,
                timeout_s=spec.request_timeout_s,
                chat=chat,
                base=base,
            )

        warmup_seconds = 0.0
        n_warm = spec.warmup_requests or 0
        if n_warm:
            if on_phase:
                on_phase("warmup")
            t0 = perf_counter()
            warm = _ClosedLoop(
                send,
                count=n_warm,
                dispatch_until=None,
                abort_on_error=True,
                failure_streak=n_warm,
                on_record=None,
            )
            cap = t0 + spec.max_duration_s
            try:
                capped = await warm.run(
                    min(c, n_warm), hard_deadline=limit.earliest(cap), cap_reason="warm-up cap"
                )
            except _WarmupFailed as exc:
                raise BenchError(f"warm-up request to {base} failed: {exc.record.error}") from None
            warmup_seconds = perf_counter() - t0
            if capped:
                done = sum(r.ok for r in warm.records)
                why = (
                    "trial deadline reached during warm-up"
                    if limit.at is not None and limit.at < cap
                    else f"warm-up did not finish within max_duration_s={spec.max_duration_s:g}"
                )
                raise BenchError(
                    f"{why} ({done} of {n_warm} warm-up requests to {base} finished in "
                    f"{warmup_seconds:.1f} s)"
                )

        if on_phase:
            on_phase("measure")
        total = spec.requests or 0
        progress = None if on_progress is None else (lambda done: on_progress(done, total))
        t0 = perf_counter()
        loop = _ClosedLoop(
            send,
            count=spec.requests,
            dispatch_until=None if spec.duration_s is None else t0 + spec.duration_s,
            abort_on_error=False,
            failure_streak=max(4 * c, 64),
            on_record=progress,
        )
        workers = c if spec.requests is None else min(c, spec.requests)
        cap = t0 + spec.max_duration_s
        by_deadline = limit.at is not None and limit.at < cap
        await loop.run(
            workers,
            hard_deadline=limit.earliest(cap),
            cap_reason="trial deadline reached" if by_deadline else "max_duration_s reached",
        )
        records = loop.records
        measure_seconds = perf_counter() - t0

    if not records:
        within = f"within max_duration_s={spec.max_duration_s:g}"
        if by_deadline:
            within = "before the trial deadline"
        raise BenchError(f"no request to {base} completed {within}")
    failures = [r for r in records if not r.ok]
    if len(failures) == len(records):
        raise BenchError(
            f"all {len(records)} measured requests to {base} failed; first error: "
            f"{failures[0].error}"
        )
    duration = max(r.end_time for r in records) - min(r.send_time for r in records)
    metrics = compute_metrics(records, duration_s=duration, slo=spec.slo)
    return BenchResult(
        records=records,
        metrics=metrics,
        warmup_seconds=warmup_seconds,
        measure_seconds=measure_seconds,
        model=model,
        stop_reason=loop.stop_reason,
    )


async def _resolve_model(
    client: httpx.AsyncClient, base: str, timeout_s: float, limit: Deadline
) -> str:
    """The served model's name from ``GET /v1/models``, within ``timeout_s`` in total."""
    wait, by_deadline = limit.cap(timeout_s)
    if by_deadline and wait <= 0:
        raise BenchError(f"trial deadline reached before the load on {base} started")
    try:
        resp = await asyncio.wait_for(client.get("/v1/models"), wait)
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
    return model_from_listing(resp, base)


def run_load(
    url: str,
    spec: LoadSpec,
    *,
    on_phase: PhaseCallback | None = None,
    on_progress: ProgressCallback | None = None,
    deadline: float | None = None,
) -> BenchResult:
    """Synchronous :func:`arun_load` (own event loop; call ``arun_load`` from async code)."""
    return asyncio.run(
        arun_load(url, spec, on_phase=on_phase, on_progress=on_progress, deadline=deadline)
    )
