"""Where a service's start-up time went, stage by stage.

A restart is most of a trial's time on a real engine (on the H200 a vLLM 0.26.0 restart took
39-163 s, a full measured phase about 20 s), and which part of it is what a user can act on:
torch.compile and CUDA-graph capture depend on the configuration (fp8 weights, compiled and
with CUDA graphs, restarted in 101-130 s where the bf16 defaults took 53-69 s and -O0 39-49 s),
loading the model does not. The launcher reads each service's log while it waits for it
(:class:`~autotune.failures.LogScan`) and notes when each start-up stage line of the engine
(:class:`~autotune.engines.StartStage`) came; the trial stores that (``TrialRecord.startup``)
and the report sums it up by stage.

Times are seconds from the service's start to the moment autotune read the line (every poll
on this machine, about once a second over SSH), not the engine's own timestamps: they need
no parsing per engine and they are what the restart cost. A stage lasts from its line to the
next stage's line, or to the service answering its health URL.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

BEFORE_STAGES = "starting the process"
"""The span before an engine's first stage line: the process start, its imports, argument
parsing (the whole start of an engine without stage lines)."""


class StageMark(BaseModel):
    """A start-up stage line and when autotune read it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: str
    at_s: float = Field(ge=0)
    """Seconds from the service's start."""


class ServiceStartup(BaseModel):
    """One service's start: the stages it went through and how it ended."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stages: list[StageMark] = Field(default_factory=list)
    ready_s: float | None = Field(default=None, ge=0)
    """Start to healthy; None when it failed."""
    failed_s: float | None = Field(default=None, ge=0)
    """Start to the failure being seen (it exited, logged a fatal line, or timed out)."""

    def spans(self) -> list[tuple[str, float]]:
        """(stage, seconds) in order, from the start to healthy or to the failure: the time
        before the first stage line is :data:`BEFORE_STAGES`; the last stage lasts until the
        service answered (vLLM's last, the warm-up, until its API server is up) or failed."""
        end = self.ready_s if self.ready_s is not None else self.failed_s
        out: list[tuple[str, float]] = []
        label, since = BEFORE_STAGES, 0.0
        for mark in self.stages:
            out.append((label, max(0.0, mark.at_s - since)))
            label, since = mark.stage, mark.at_s
        if end is None:
            return out
        out.append((label, max(0.0, end - since)))
        return out
