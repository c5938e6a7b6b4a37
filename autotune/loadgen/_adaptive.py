"""The measure phase's live estimate: the target-CI stop and the caller's ``abort_if``.

Every ``ESTIMATE_INTERVAL_S`` it updates the throughput estimate
(:class:`~autotune.loadgen.estimate.ThroughputTracker`); once ``min_duration_s`` has passed it
stops dispatching when the 95% CI is as tight as ``target_rel_ci`` (in-flight requests
finish), and ends the phase at once when :data:`AbortRule` gives a reason. It runs beside
the loop as its ticker (:meth:`~._loops._Loop.run`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import perf_counter

from autotune.loadgen._loops import _Loop
from autotune.loadgen.estimate import LiveEstimate, ThroughputTracker
from autotune.loadgen.spec import LoadSpec

AbortRule = Callable[[LiveEstimate], "str | None"]

ESTIMATE_INTERVAL_S = 0.25
"""How often the live estimate is updated (target check and ``abort_if``) while measuring."""


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
