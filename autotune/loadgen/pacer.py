"""The open loop's next due write, checked between every two stream callbacks.

Why: one event loop both dispatches an open loop's requests and parses the streams it
measures, and a batched decode step makes every in-flight stream readable at once. asyncio
runs all of an iteration's ready callbacks before it returns to the dispatcher, so a request
that falls due during such a batch waited for the whole batch: at 16-128 req/s on two cores
that was a send-lag p99 of 1.2-1.6 ms (BENCHMARKS.md, "Does the open loop keep its
schedule?"). With a pacer, the dispatcher prepares the request ahead of time (body rendered,
connection open) and arms it; every stream read checks the clock against :attr:`Pacer.due`
(one comparison) and fires the write itself when it is due, so the lag is bounded by one
callback, not by one iteration. The dispatcher still fires it when nothing else runs.

A thread was tried first and measured worse: a thread waking for the write must take the GIL
from a loop thread that is busy parsing, and its lag grew to tens of milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable


class Pacer:
    """At most one armed write: when it is due, and what makes it."""

    __slots__ = ("due", "_fire", "from_reads")

    def __init__(self) -> None:
        self.due = math.inf
        """When the armed write is due (``perf_counter`` time); infinity when none is."""
        self._fire: Callable[[], None] | None = None
        self.from_reads = 0
        """Writes a stream read made (the rest the dispatcher made)."""

    def arm(self, due: float, fire: Callable[[], None]) -> None:
        self.due, self._fire = due, fire

    def fire(self) -> None:
        """Make the armed write now (whoever sees it due first), once."""
        fire, self._fire, self.due = self._fire, None, math.inf
        if fire is not None:
            fire()

    def fire_from_read(self) -> None:
        """:meth:`fire`, called by a stream read that saw the write due."""
        if self._fire is not None:
            self.from_reads += 1
        self.fire()

    def disarm(self) -> None:
        """Forget the armed write (its dispatcher was cancelled before it was due)."""
        self._fire, self.due = None, math.inf

    @property
    def armed(self) -> bool:
        return self._fire is not None
