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

The pieces are modules of their own: the request bodies (:mod:`._bodies`), the stream's
sink (:mod:`._stream`), one request's send and record (:mod:`._request`), the closed and
open loops (:mod:`._loops`), the live estimate's stop and abort rules (:mod:`._adaptive`)
and the model lookup (:mod:`._model_lookup`); the transport, records, metrics and estimate
were already. This module holds the session that runs them (warm-up, measure phases, the
result, :func:`arun_load` / :func:`run_load`) and re-exports the names others import from it.
``LoadSession.measure`` builds its arrival schedule through this module's
``ArrivalSchedule``, which ``benchmarks/agreement.py`` replaces to replay vLLM's.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from time import perf_counter, thread_time
from typing import Any

from pydantic import BaseModel, ConfigDict

from autotune.errors import BenchError, BenchTimeout
from autotune.loadgen._adaptive import ESTIMATE_INTERVAL_S, AbortRule, _Adaptive
from autotune.loadgen._bodies import _Bodies, expected_requests
from autotune.loadgen._http import (
    JSON_HEADERS,
    Deadline,
    base_url,
    endpoint,
)
from autotune.loadgen._loops import _ClosedLoop, _Loop, _OpenLoop, _WarmupFailed
from autotune.loadgen._model_lookup import _resolve_model
from autotune.loadgen._request import Prepare, _prepare, _Prepared, _unanswered
from autotune.loadgen._steal import steal_seconds, steal_share
from autotune.loadgen._stream import _Attempt, _Stream
from autotune.loadgen.arrivals import ArrivalSchedule
from autotune.loadgen.estimate import LiveEstimate, ThroughputTracker
from autotune.loadgen.metrics import Metrics, compute_metrics, with_client_load
from autotune.loadgen.pacer import Pacer
from autotune.loadgen.records import RequestRecord
from autotune.loadgen.spec import LoadSpec
from autotune.loadgen.transport import Endpoint, WorkerConnection

__all__ = [
    "ESTIMATE_INTERVAL_S",
    "AbortRule",
    "BenchResult",
    "LoadSession",
    "PhaseCallback",
    "Prepare",
    "ProgressCallback",
    "arun_load",
    "expected_requests",
    "run_load",
    # private names that tests and benchmarks reach into (tests/loadgen/test_pacer.py,
    # test_bench_timeout.py; benchmarks/agreement.py, send_lag.py)
    "_Attempt",
    "_Bodies",
    "_OpenLoop",
    "_Stream",
    "_unanswered",
]

PhaseCallback = Callable[[str], None]
ProgressCallback = Callable[[int, int], None]

_STREAM_HEADERS = {
    "Content-Type": JSON_HEADERS["content-type"],
    "Accept": JSON_HEADERS["accept"],
    "Accept-Encoding": "identity",
    "User-Agent": "autotune-loadgen",
}
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
    """Why the measure phase ended early or adaptively (``max_duration_s`` cap, failure
    streak, ``target CI reached``, ``aborted: ...``), if so."""
    aborted: str | None = None
    """The reason ``abort_if`` gave, when it cut the measure phase."""
    estimate: LiveEstimate | None = None
    """The last live estimate (throughput and its CI) when it was tracked
    (``target_rel_ci`` or ``abort_if`` given)."""


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
