"""The raw per-request record every figure is derived from.

Tools disagree on metric names (DOMAIN.md §3), so the load generator keeps timestamps, not
conclusions: send time, the arrival time of every chunk that carried generated text, the
end time, the server's token counts and the error. Times are ``time.perf_counter()``
seconds; only differences between them mean anything.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class RequestRecord(BaseModel):
    """One streamed request, successful (``error is None``) or not."""

    model_config = ConfigDict(extra="forbid")

    index: int
    """Dispatch order within its phase."""
    send_time: float
    due_time: float | None = None
    """Open loop: when the arrival schedule (or a freed ``max_concurrency`` slot) made the
    request due; ``send_time - due_time`` is the client's send lag. ``None`` in a closed loop."""
    end_time: float
    """When the stream finished (``[DONE]`` read), failed or timed out."""
    chunk_times: list[float] = Field(default_factory=list)
    """Arrival of each chunk with non-empty generated text; the first one defines TTFT."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    """From the server's ``usage``; ``None`` when the stream carried no usage."""
    status: int | None = None
    """HTTP status; ``None`` when no response arrived."""
    error: str | None = None
    text: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def latency_s(self) -> float:
        return self.end_time - self.send_time

    @property
    def send_lag_s(self) -> float | None:
        return None if self.due_time is None else self.send_time - self.due_time

    @property
    def first_chunk_time(self) -> float | None:
        return self.chunk_times[0] if self.chunk_times else None

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times[0] - self.send_time if self.chunk_times else None

    @property
    def usage_missing(self) -> bool:
        return self.completion_tokens is None

    @property
    def output_tokens(self) -> int:
        """Server-counted tokens; counted chunks only when usage is missing (flagged)."""
        if self.completion_tokens is not None:
            return self.completion_tokens
        return len(self.chunk_times)

    @property
    def tpot_s(self) -> float | None:
        """(latency - TTFT) / (output tokens - 1); ``None`` for one token or no text."""
        ttft = self.ttft_s
        n = self.output_tokens
        if ttft is None or n <= 1:
            return None
        return (self.latency_s - ttft) / (n - 1)
