"""When to stop measuring a trial early: the policy, behind a narrow base class.

Like Optuna's ``BasePruner``, a policy sees one running trial at a time, here the load
generator's live throughput estimate, and says whether to stop, with the reason stored on the
trial (``aborted``). The study loop asks :meth:`AbortPolicy.rule` once per trial for the
load generator's ``abort_if``, giving it the incumbent (the best feasible, fully measured
trial so far); None means the trial is measured to its end.
"""

from __future__ import annotations

import abc
import math

from autotune.loadgen import AbortRule, LiveEstimate, LoadSpec
from autotune.study.definition import EarlyAbortSettings


class AbortPolicy(abc.ABC):
    """Decides, from a running estimate, that a trial is not worth measuring further."""

    @abc.abstractmethod
    def reason(
        self, estimate: LiveEstimate, *, incumbent: tuple[float, int], load: LoadSpec
    ) -> str | None:
        """Why the measure phase should stop now (stored as ``aborted``), or None.

        ``incumbent``: (throughput in modeled tok/s, trial number) of the best trial so far.
        """

    def rule(self, *, incumbent: tuple[float, int] | None, load: LoadSpec) -> AbortRule | None:
        """The load generator's ``abort_if`` for the next trial (None: never abort)."""
        if incumbent is None:
            return None
        held = incumbent

        def abort_if(estimate: LiveEstimate) -> str | None:
            return self.reason(estimate, incumbent=held, load=load)

        return abort_if


class NeverAbort(AbortPolicy):
    """Every trial is measured to its end (no ``early_abort`` in the study)."""

    def reason(
        self, estimate: LiveEstimate, *, incumbent: tuple[float, int], load: LoadSpec
    ) -> str | None:
        return None

    def rule(self, *, incumbent: tuple[float, int] | None, load: LoadSpec) -> AbortRule | None:
        return None


class BelowIncumbent(AbortPolicy):
    """Stop once even an optimistic figure is below ``abort_below`` x the incumbent
    (:func:`early_abort_reason`); figures are compared in modeled time (``speedup``)."""

    def __init__(self, settings: EarlyAbortSettings, *, speedup: float = 1.0) -> None:
        self.settings = settings
        self.speedup = speedup

    def reason(
        self, estimate: LiveEstimate, *, incumbent: tuple[float, int], load: LoadSpec
    ) -> str | None:
        return early_abort_reason(
            estimate,
            settings=self.settings,
            incumbent=incumbent,
            streams=load.streams,
            output_len=load.max_output_len,
            speedup=self.speedup,
        )

    def rule(self, *, incumbent: tuple[float, int] | None, load: LoadSpec) -> AbortRule | None:
        if incumbent is None or self.settings.abort_below * incumbent[0] <= 0:
            return None
        return super().rule(incumbent=incumbent, load=load)


def make_abort_policy(settings: EarlyAbortSettings | None, *, speedup: float) -> AbortPolicy:
    return NeverAbort() if settings is None else BelowIncumbent(settings, speedup=speedup)


def early_abort_reason(
    estimate: LiveEstimate,
    *,
    settings: EarlyAbortSettings,
    incumbent: tuple[float, int],
    streams: int,
    output_len: int | None,
    speedup: float = 1.0,
) -> str | None:
    """Why the measure phase should stop now, or None: even an optimistic figure for this
    trial is below ``abort_below`` x the incumbent's throughput (``incumbent``: throughput,
    trial number; in modeled time, so the wall-clock estimate is divided by ``speedup``).

    The optimistic figure is, in order of what is known:

    * the upper 95% confidence bound, once the load generator has an interval;
    * every stream finished a request: the running estimate x (1 + ``margin_before_ci``);
      the steady rate may cover only the start of the second round (all streams back in
      prefill: low) and completed tokens / elapsed sinks between completions, so the larger
      of the two is taken;
    * the first round unfinished but ``k >= 1`` of its requests done (a server that serves
      one request at a time): the ``streams - k`` requests still out have lasted
      ``elapsed_s``, so the round's mean latency is at least ``(streams - k) / streams x
      elapsed_s``, and by Little's law a closed loop of ``streams`` cannot give more than
      ``streams x output_len`` tokens per mean latency; that bound x (1 +
      ``margin_before_ci``). A one-at-a-time server is therefore cut after a few requests
      instead of after a whole round of them (minutes on a GPU; BENCHMARKS.md, H200
      section). ``output_len`` is the longest output a request may ask for
      (``LoadSpec.max_output_len``); None (answers of unbounded length) skips this bound.
      Never with nothing done: the trial's figure is its completed requests, and
      a trial without any would be stored as a failure, not as a slow configuration.
    """
    margin = settings.margin_before_ci
    half = estimate.rel_half_width
    rate = estimate.output_throughput
    shown = rate / speedup
    done = estimate.completed
    elapsed = estimate.elapsed_s
    if half is not None and math.isfinite(half):
        basis = "upper 95% bound"
    elif margin is None:
        return None
    elif done >= streams:
        if elapsed > 0 and output_len is not None:
            rate = max(rate, done * output_len / elapsed)
        shown = rate / speedup
        half, basis = margin, f"estimate + {margin:.0%} (no interval yet)"
    elif elapsed > 0 and done >= 1 and output_len is not None:
        rate = max(rate, streams * streams * output_len / ((streams - done) * elapsed))
        half = margin
        basis = f"first round unfinished after {elapsed:.1f} s: latency bound + {margin:.0%}"
    else:
        return None
    upper = rate / speedup * (1.0 + half)
    if upper >= settings.abort_below * incumbent[0]:
        return None
    return (
        f"{shown:,.1f} tok/s after {done} requests, {basis} {upper:,.1f} < "
        f"{settings.abort_below:g} x incumbent #{incumbent[1]} ({incumbent[0]:,.1f} tok/s)"
    )
