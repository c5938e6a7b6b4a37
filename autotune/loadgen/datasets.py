"""Request datasets: what each request of a load asks for, seeded and reproducible.

A trial is only comparable with another if both sent the same requests, so every dataset is
a pure function of ``(spec, seed, count)``: :func:`build_prompts` returns the same list for
equal inputs, and prompt ``i`` does not depend on ``count`` (a longer run extends a shorter
one). Three kinds, defined like sglang's ``bench_serving`` (``python/sglang/benchmark/
datasets/``: ``random.py``, ``sharegpt.py``, ``generated_shared_prefix.py``, ``common.py``);
where ``vllm bench serve`` (``vllm/benchmarks/datasets.py``) differs, the field docs say so:

* ``random``: lengths per prompt uniform in ``[max(int(len * ratio), 1), len]``, content
  random tokens: a given prefill/decode mix with no prefix reuse.
* ``sharegpt``: real conversations (a ShareGPT-format JSON file), answer lengths as
  ``max_tokens``; the prompt-length mix of chat traffic, optionally multi-turn history.
* ``shared_prefix``: ``groups`` system prompts each shared by ``prompts_per_group``
  questions; what a prefix cache (RadixAttention, prefix caching) is tuned for.

Token counts are content tokens: a tokenizer's ``encode`` adds no BOS/EOS and no chat
template, so ``Prompt.input_tokens`` is what the prompt itself holds; the server adds its own
special tokens and template on top (reported in its ``usage.prompt_tokens``).

This module is the public entry point (:func:`build_prompts`, :func:`dataset_summary`) and
re-exports the rest; the parts live beside it: ``_dataset_models`` (the specs and
:class:`Prompt`), ``_tokenizer`` (tokenizers, prompt vocabulary), ``_draw`` (seeded draws),
``_synthetic`` (``random``, ``shared_prefix``) and ``_sharegpt``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from autotune.errors import ConfigError
from autotune.loadgen._dataset_models import (
    DatasetSpec,
    Prompt,
    RandomDataset,
    SharedPrefixDataset,
    ShareGPTDataset,
)
from autotune.loadgen._sharegpt import SAMPLE_SHAREGPT, _sharegpt_prompts
from autotune.loadgen._synthetic import _random_prompts, _shared_prefix_prompts
from autotune.loadgen._tokenizer import (
    PROMPT_WORDS,
    TOKEN_ID_RANGE,
    Tokenizer,
    WordTokenizer,
    load_tokenizer,
)

__all__ = [
    "PROMPT_WORDS",
    "SAMPLE_SHAREGPT",
    "TOKEN_ID_RANGE",
    "DatasetSpec",
    "Prompt",
    "RandomDataset",
    "ShareGPTDataset",
    "SharedPrefixDataset",
    "Tokenizer",
    "WordTokenizer",
    "build_prompts",
    "dataset_summary",
    "load_tokenizer",
]


def build_prompts(
    spec: RandomDataset | ShareGPTDataset | SharedPrefixDataset,
    *,
    count: int,
    seed: int,
    form: Literal["token_ids", "text"],
    chat: bool,
    tokenizer: Tokenizer,
    first: int = 0,
) -> list[Prompt]:
    """Exactly ``count`` prompts, a pure function of ``(spec, seed, count)`` and the tokenizer.

    ``first``: start at prompt ``first`` (``build_prompts(first=k, count=n)`` equals
    ``build_prompts(count=k + n)[k:]``), so a long run extends its prompts in batches.

    ``form="token_ids"`` sets ``Prompt.token_ids`` (completions only: chat takes text);
    ``chat=True`` sets ``Prompt.messages``.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if form == "token_ids" and chat:
        raise ConfigError(
            "prompt 'token_ids' needs api 'completions' (chat takes text)",
            field="prompt",
            allowed=["text"],
        )
    if first < 0:
        raise ValueError(f"first must be >= 0, got {first}")
    if count == 0:
        return []
    if isinstance(spec, RandomDataset):  # one generator per prompt: build only the range
        return _random_prompts(spec, range(first, first + count), seed, form, chat, tokenizer)
    if isinstance(spec, ShareGPTDataset):
        return _sharegpt_prompts(spec, first + count, seed, form, chat, tokenizer)[first:]
    return _shared_prefix_prompts(spec, first + count, seed, form, chat, tokenizer)[first:]


def dataset_summary(prompts: Sequence[Prompt]) -> dict[str, Any]:
    """Counts and token statistics of built prompts, for logs and tests (JSON-ready)."""

    def stats(values: list[int]) -> dict[str, float | int] | None:
        if not values:
            return None
        a = np.asarray(values)
        return {
            "mean": float(a.mean()),
            "min": int(a.min()),
            "max": int(a.max()),
            "p50": float(np.percentile(a, 50)),
            "total": int(a.sum()),
        }

    groups = {p.group for p in prompts if p.group is not None}
    return {
        "count": len(prompts),
        "distinct": len({(p.text, repr(p.messages), p.token_ids) for p in prompts}),
        "input_tokens": stats([p.input_tokens for p in prompts]),
        "output_tokens": stats([p.output_tokens for p in prompts]),
        "groups": len(groups),
        "token_ids": sum(p.token_ids is not None for p in prompts),
        "chat": sum(p.messages is not None for p in prompts),
        "multi_turn": sum(
            p.messages is not None and sum(m["role"] == "user" for m in p.messages) > 1
            for p in prompts
        ),
    }
