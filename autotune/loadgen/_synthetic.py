"""The generated dataset kinds: ``random`` and ``shared_prefix`` prompts of random tokens.

Part of :mod:`autotune.loadgen.datasets` (import from there; this module is its implementation).
Both fill drawn lengths with token ids, words or text fitted to a token count, drawn from the
tokenizer's pools (:mod:`autotune.loadgen._draw`); ``random`` takes one generator per prompt,
``shared_prefix`` one for the whole set (its groups are shuffled together). Apart from
ShareGPT's file reading and filters, which these kinds have none of.
"""

from __future__ import annotations

from autotune.loadgen._dataset_models import Prompt, RandomDataset, SharedPrefixDataset
from autotune.loadgen._draw import (
    _SEPARATOR,
    _draw_ids,
    _draw_len,
    _draw_words,
    _fit_text,
    _rng,
)
from autotune.loadgen._tokenizer import Tokenizer, WordTokenizer, _pools


def _random_prompts(
    spec: RandomDataset,
    indices: range,
    seed: int,
    form: str,
    chat: bool,
    tokenizer: Tokenizer,
) -> list[Prompt]:
    ordinary, safe = _pools(tokenizer)
    words = isinstance(tokenizer, WordTokenizer)
    prompts = []
    for i in indices:
        rng = _rng(seed, i)
        n_in = _draw_len(rng, spec.input_len, spec.range_ratio)
        n_out = _draw_len(rng, spec.output_len, spec.range_ratio)
        ids: tuple[int, ...] | None = None
        if form == "token_ids":
            ids = tuple(_draw_ids(rng, ordinary, n_in))
            text, n = tokenizer.decode(ids), n_in
        elif words:
            text, n = _draw_words(rng, n_in), n_in
        else:
            text, n = _fit_text(tokenizer, rng, safe, n_in)
        messages = ({"role": "user", "content": text},) if chat else None
        prompts.append(Prompt(text, ids, messages, n, n_out))
    return prompts


def _shared_prefix_prompts(
    spec: SharedPrefixDataset,
    count: int,
    seed: int,
    form: str,
    chat: bool,
    tokenizer: Tokenizer,
) -> list[Prompt]:
    """Chat: a system message (the shared prefix) and a user message (the question), the
    form a chat template renders as a shared prefix too; completions: one joined text."""
    rng = _rng(seed)
    ordinary, safe = _pools(tokenizer)
    words = isinstance(tokenizer, WordTokenizer)

    def part(n: int) -> tuple[str, list[int] | None, int]:
        if form == "token_ids":
            ids = _draw_ids(rng, ordinary, n)
            return tokenizer.decode(ids), ids, n
        if words:
            return _draw_words(rng, n), None, n
        text, got = _fit_text(tokenizer, rng, safe, n)
        return text, None, got

    systems = [part(spec.system_prompt_len) for _ in range(spec.groups)]
    prompts = []
    for g, (system, system_ids, system_n) in enumerate(systems):
        for _ in range(spec.prompts_per_group):
            question, question_ids, question_n = part(spec.question_len)
            text = f"{system}{_SEPARATOR}{question}"
            ids: tuple[int, ...] | None = None
            messages = None
            if system_ids is not None and question_ids is not None:
                ids = (*system_ids, *question_ids)
                text, n_in = tokenizer.decode(ids), len(ids)
            elif chat:
                messages = (
                    {"role": "system", "content": system},
                    {"role": "user", "content": question},
                )
                n_in = system_n + question_n
            else:
                n_in = system_n + question_n if words else len(tokenizer.encode(text))
            prompts.append(Prompt(text, ids, messages, n_in, spec.output_len, group=g))
    order = rng.permutation(len(prompts))
    return [prompts[int(order[i % len(order)])] for i in range(count)]
