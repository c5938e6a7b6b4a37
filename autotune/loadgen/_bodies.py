"""The request bodies a load sends: dataset prompts rendered to JSON, one per dispatch.

Prompts come from :mod:`autotune.loadgen.datasets` in dataset order (deterministic in the
seed) and are built ahead of a phase (:meth:`_Bodies.reserve`, sized by
:func:`expected_requests`), so building them shows as neither send lag nor a busy event loop.
A session keeps one :class:`_Bodies` across its phases, so each phase sends the prompts after
the previous phase's. Apart from the loops because it is the only part that knows the
dataset, the tokenizer and the API's body format (``benchmarks/agreement.py`` rebuilds the
same prompts through it).
"""

from __future__ import annotations

import json
from typing import Any

from autotune.loadgen.datasets import (
    Prompt,
    build_prompts,
    load_tokenizer,
)
from autotune.loadgen.spec import LoadSpec


class _Bodies:
    """JSON request bodies, one per dispatch, in dataset order (deterministic in the seed).

    Prompts are built before a phase starts (:meth:`reserve`, outside any timing: building
    one costs up to a millisecond, which would show as send lag and steal the event loop
    from the streams); a phase that outruns its reservation builds more as it goes.
    """

    def __init__(self, spec: LoadSpec, model: str) -> None:
        self._spec = spec
        self._dataset = spec.requests_dataset
        self._tokenizer = load_tokenizer(spec.tokenizer)
        self._prompts: list[Prompt] = []
        self._first = 0
        """Index of ``_prompts[0]`` in the dataset."""
        self._next = 0
        self._ready: bytes | None = None
        self._base: dict[str, Any] = {
            "model": model,
            "temperature": spec.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if spec.ignore_eos is not None:  # a server that refuses unknown fields gets none
            self._base["ignore_eos"] = spec.ignore_eos

    def reserve(self, n: int) -> None:
        """Have the next ``n`` prompts built (those already sent are dropped)."""
        have = self._first + len(self._prompts)
        if self._next + n <= have:
            return
        kept = self._prompts[self._next - self._first :]
        spec = self._spec
        more = build_prompts(
            self._dataset,
            first=have,
            count=self._next + n - have,
            seed=spec.seed,
            form="token_ids" if spec.prompt == "token_ids" else "text",
            chat=spec.api == "chat",
            tokenizer=self._tokenizer,
        )
        self._prompts = kept + more
        self._first = self._next

    def prompt(self) -> Prompt:
        """The next request's prompt."""
        if self._next >= self._first + len(self._prompts):
            self.reserve(max(64, len(self._prompts)))
        p = self._prompts[self._next - self._first]
        self._next += 1
        return p

    def prefetch(self) -> None:
        """Render the next body now (the open loop does it while it waits for the next
        arrival, so a due request only has to be written)."""
        if self._ready is None:
            self._ready = self._render()

    def next(self) -> bytes:
        ready, self._ready = self._ready, None
        return ready if ready is not None else self._render()

    def _render(self) -> bytes:
        p = self.prompt()
        body = dict(self._base)
        body["max_tokens"] = p.output_tokens
        if self._spec.api == "chat":
            body["messages"] = (
                list(p.messages) if p.messages else [{"role": "user", "content": p.text}]
            )
        elif p.token_ids is not None:
            body["prompt"] = list(p.token_ids)
        else:
            body["prompt"] = p.text
        return json.dumps(body, separators=(",", ":")).encode()


def expected_requests(spec: LoadSpec) -> int:
    """About how many requests one measure phase of ``spec`` sends (prompts to build)."""
    if spec.requests is not None and spec.target_rel_ci is None:
        return spec.requests
    if spec.request_rate is not None:
        seconds = spec.duration_s or spec.max_duration_s
        return int(spec.request_rate * seconds * 1.2) + 16
    return max(256, 8 * spec.concurrency)
