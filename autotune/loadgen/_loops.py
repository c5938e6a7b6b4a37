"""The phase loops: closed (C workers) and open (the arrival schedule), on shared state.

:class:`_Loop` holds what a phase shares: its records, the stop rules (count, dispatch
window, failure streak), the hard deadline that cancels in-flight requests, and the
ticker beside it (the live estimate, :mod:`._adaptive`). :class:`_ClosedLoop` sends a
worker's next request when its last one finished; :class:`_OpenLoop` sends on the schedule
whatever is in flight, its writes timed with :class:`~autotune.loadgen.pacer.Pacer`.
Warm-up runs a closed loop that raises :class:`_WarmupFailed` at its first failed request.
"""

from __future__ import annotations

import asyncio
import collections
import math
from collections.abc import Awaitable, Callable, Coroutine
from time import perf_counter
from typing import Any

from autotune.loadgen._request import Prepare
from autotune.loadgen.arrivals import ArrivalSchedule
from autotune.loadgen.pacer import Pacer
from autotune.loadgen.records import RequestRecord


class _WarmupFailed(Exception):
    def __init__(self, record: RequestRecord) -> None:
        super().__init__(record.error)
        self.record = record


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
