"""The narrow interface the trial pipeline samples GPUs through (like Optuna's
``BasePruner``: one small base class, a real implementation and a null one).

A sampler is made when a trial's services are up (opening NVML can take a moment: it must
not land inside the measured phase), :meth:`TelemetrySampler.begin` is called at the start
of the measured phase, and :meth:`TelemetrySampler.end` when the phase's load is over (a
curve swept afterwards on the same processes is not in it). ``end`` is idempotent, so the
pipeline also calls it on the way out of a failed load, Ctrl-C included, which releases
whatever the sampler holds.
"""

from __future__ import annotations

from autotune.telemetry.model import Telemetry


class TelemetrySampler:
    """Samples a trial's GPUs over the measured phase; this base records nothing."""

    none_reason: str | None = None
    """Why this sampler measures nothing (``None``: it measures)."""

    def begin(self) -> None:
        """The measured phase starts: sample from now on (returns at once)."""

    def end(self) -> Telemetry | None:
        """The measured phase is over: stop and summarize; ``None`` when :meth:`begin` was
        never called (nothing was measured). A second call returns the first one's result."""
        return None

    def __enter__(self) -> TelemetrySampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()


class NoTelemetry(TelemetrySampler):
    """A machine or a deployment whose GPUs cannot be measured: every measured phase
    records ``source: none`` with :attr:`none_reason`."""

    def __init__(self, reason: str) -> None:
        self.none_reason = reason
        self._begun = False

    def begin(self) -> None:
        self._begun = True

    def end(self) -> Telemetry | None:
        return Telemetry.none(self.none_reason or "") if self._begun else None
