"""What a request dataset is: the three dataset specs of ``load.dataset`` and the prompt built.

Part of :mod:`autotune.loadgen.datasets` (import from there; this module is its implementation).
The pydantic models are what a load spec validates (``random``, ``sharegpt``,
``shared_prefix``: their field docs say where sglang's and vLLM's benchmarks differ) and
:class:`Prompt` is what every dataset kind builds; both are plain data, read by the load spec
and by every builder, so they sit in one module below the builders.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

_MAX_TOKENS = 1 << 20  # the cap LoadSpec puts on lengths: prompts are built in memory


@dataclass(frozen=True, slots=True)
class Prompt:
    """One request's content.

    ``input_tokens`` counts what is sent: the ids (``token_ids`` form), the text (completions)
    or the sum over the messages' contents (chat, before the server's template).
    """

    text: str
    """The prompt as text (always set; for token-id prompts the decoded ids)."""
    token_ids: tuple[int, ...] | None
    """Set in the ``token_ids`` form: completions with exact input lengths."""
    messages: tuple[dict[str, str], ...] | None
    """Chat history ending with the user turn to answer (``chat=True``); None: ``text``."""
    input_tokens: int
    output_tokens: int
    """``max_tokens`` to request (with ``ignore_eos``: the exact output length)."""
    group: int | None = None
    """Shared-prefix group id (``shared_prefix`` only)."""


class RandomDataset(BaseModel):
    """Random prompts of given lengths, like ``bench_serving --dataset-name random-ids`` and
    vLLM's ``random`` (sglang's ``random`` instead fills the lengths with ShareGPT text,
    repeated or cut). Ids are drawn independently and uniformly from the ordinary vocabulary
    (both tools take consecutive ids from a random offset; the cost of a forward pass does
    not depend on which ids).

    ``range_ratio`` follows sglang's ``--random-range-ratio``: each length is uniform over the
    integers ``[max(int(len * range_ratio), 1), len]``; 1.0 fixes it (DOMAIN.md §3). vLLM's
    flag of the same name means a symmetric range ``[len * (1 - r), len * (1 + r)]`` with 0 =
    fixed: a vLLM ``--random-range-ratio 0.5`` is not ours. (sglang's default is 0.0, uniform
    from 1; ours is 1.0 because a tuner compares configurations at fixed lengths.)
    """

    model_config = ConfigDict(extra="forbid")

    kind: Literal["random"] = "random"
    input_len: int = Field(default=256, ge=1, le=_MAX_TOKENS)
    output_len: int = Field(default=32, ge=1, le=_MAX_TOKENS)
    range_ratio: float = Field(default=1.0, ge=0.0, le=1.0)


class ShareGPTDataset(BaseModel):
    """Conversations from a ShareGPT-format JSON file: ``[{"id"?, "conversations": [{"from":
    "human" | "gpt" | "system", "value": str}, ...]}, ...]`` (``user``/``assistant`` and the
    ``chatgpt``/``bing``/``bard`` aliases of public dumps are read as such too).

    ``turns="first"``: one request per conversation, its first human turn (after any system
    turn), answered by the gpt turn after it, like bench_serving. ``"multi"``: every human
    turn that has an answer is a request, carrying all earlier turns (the dataset's own
    answers) as history, so the server sees a conversation's prefix grow; its requests stay
    in conversation order, one conversation after the other.

    Filters, on the token counts of each request: prompts shorter than ``min_len`` are
    dropped, and so are answers shorter than it when ``output_len`` is None; prompts longer
    than ``max_prompt_len`` are dropped, and prompt + answer longer than ``max_total_len``
    when ``output_len`` is None. The defaults (4, 1024, 2048) are vLLM's ``is_valid_sequence``
    and sglang's filters before its datasets/ refactor (``prompt_len > 1024 or (prompt_len +
    output_len > 2048 and fixed_output_len is None)``); current sglang keeps prompt and
    answer >= 2 tokens and checks only ``--sharegpt-context-len`` (unset by default): set
    ``min_len: 2, max_prompt_len: null, max_total_len: CONTEXT`` for that. vLLM also applies
    the total limit with a fixed output length; we do not (the requested length is yours).
    """

    model_config = ConfigDict(extra="forbid")

    kind: Literal["sharegpt"] = "sharegpt"
    path: Path
    turns: Literal["first", "multi"] = "first"
    output_len: int | None = Field(default=None, ge=1, le=_MAX_TOKENS)
    """None: the answer's token count as ``max_tokens`` (bench_serving); else this, fixed."""
    min_len: int = Field(default=4, ge=0)
    max_prompt_len: int | None = Field(default=1024, ge=1)
    max_total_len: int | None = Field(default=2048, ge=1)


class SharedPrefixDataset(BaseModel):
    """bench_serving's ``generated-shared-prefix``: ``groups`` random system prompts of
    ``system_prompt_len`` tokens, each followed by ``prompts_per_group`` random questions of
    ``question_len`` tokens; a prompt is ``system + "\\n\\n" + question``, the
    ``groups * prompts_per_group`` prompts shuffled with the seed (sglang shuffles unless
    ``--gsp-ordered``), then cycled or cut to ``count`` (sglang ignores ``--num-prompts`` here).
    Defaults are sglang's ``--gsp-*`` defaults (64, 16, 2048, 128, 256); its
    ``--gsp-range-ratio`` (default 1.0, fixed) and multi-turn options are not modelled.
    """

    model_config = ConfigDict(extra="forbid")

    kind: Literal["shared_prefix"] = "shared_prefix"
    groups: int = Field(default=64, ge=1, le=1 << 16)
    prompts_per_group: int = Field(default=16, ge=1, le=1 << 16)
    system_prompt_len: int = Field(default=2048, ge=1, le=_MAX_TOKENS)
    question_len: int = Field(default=128, ge=1, le=_MAX_TOKENS)
    output_len: int = Field(default=256, ge=1, le=_MAX_TOKENS)


DatasetSpec = Annotated[
    RandomDataset | ShareGPTDataset | SharedPrefixDataset, Field(discriminator="kind")
]
