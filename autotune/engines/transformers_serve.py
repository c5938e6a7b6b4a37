"""``transformers serve`` (HuggingFace transformers), manifest from its typer/click command.

Its OpenAI endpoint refuses unknown request fields (``ignore_eos`` gets HTTP 422), ends streams
after the finish-reason chunk without ``data: [DONE]``, takes string prompts, and loads the
model each request names, so every request must name it. It has no version endpoint.
"""

from __future__ import annotations

from typing import ClassVar

from autotune.engines._base import BaseEngine, FailurePattern, RequestQuirks


class TransformersServeEngine(BaseEngine):
    name: ClassVar[str] = "transformers-serve"
    default_version: ClassVar[str | None] = "5.17.0"
    programs: ClassVar[tuple[str, ...]] = ("transformers serve",)
    failure_patterns: ClassVar[tuple[FailurePattern, ...]] = (
        # continuous batching sizes its paged KV cache on the first request:
        # "MemoryError: Memory footprint 1.2e+11 is more than available memory 9.8e+10".
        FailurePattern(90, "cuda_oom", r"MemoryError: Memory footprint .* more than available"),
        # continuous batching with a KV cache smaller than one request.
        FailurePattern(60, "config_rejected", r"No requests can be scheduled and no requests can"),
    )
    quirks: ClassVar[RequestQuirks] = RequestQuirks(
        ignore_eos=None, require_done=False, prompt="text", pin_model=True
    )
