"""Seeded draws that dataset prompts are made of: generators, lengths, ids, words, fitted text.

Part of :mod:`autotune.loadgen.datasets` (import from there; this module is its implementation).
One generator per ``(seed, keys)`` (:func:`_rng`) is what makes every dataset a pure function
of ``(spec, seed, count)``; the generated kinds (:mod:`autotune.loadgen._synthetic`) and
ShareGPT's shuffle and token counts (:mod:`autotune.loadgen._sharegpt`) share these helpers,
so they sit in one module below both.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from autotune.loadgen._tokenizer import PROMPT_WORDS, Tokenizer

_FIT_ROUNDS = 8
_SEPARATOR = "\n\n"  # bench_serving joins system prompt and question, and we join history turns


def _rng(seed: int, *keys: int) -> np.random.Generator:
    """A generator per (seed, keys): streams independent of each other and of ``count``."""
    return np.random.default_rng([seed % (1 << 64), *keys])


def _draw_len(rng: np.random.Generator, full: int, ratio: float) -> int:
    """sglang's ``compute_random_lens``: uniform in ``[max(int(full * ratio), 1), full]``."""
    return int(rng.integers(max(int(full * ratio), 1), full + 1))


def _draw_ids(rng: np.random.Generator, pool: np.ndarray, n: int) -> list[int]:
    return pool[rng.integers(0, len(pool), size=n)].tolist()


def _draw_words(rng: np.random.Generator, n: int) -> str:
    return " ".join([PROMPT_WORDS[k] for k in rng.integers(0, len(PROMPT_WORDS), size=n)])


def _fit_text(
    tokenizer: Tokenizer, rng: np.random.Generator, pool: np.ndarray, target: int
) -> tuple[str, int]:
    """Text of random tokens that re-encodes to ``target`` tokens, and its real count.

    Decoded ids do not always re-encode to the same number of tokens (byte-level BPE merges
    across the joins), so: decode, re-encode, cut the re-encoding to ``target`` or pad it with
    more random ids, repeat (vLLM's ``gen_prompt_decode_to_target_len`` does the same).
    Drawing from text-safe ids (:meth:`_LoadedTokenizer.pools`), a word-level and a
    byte-level BPE tokenizer land exactly on every prompt of the tests; should a tokenizer
    not converge in ``_FIT_ROUNDS`` the closest attempt is kept. The returned count is the
    real one, never the target.
    """
    ids = _draw_ids(rng, pool, target)
    best: tuple[str, int] | None = None
    for _ in range(_FIT_ROUNDS):
        text = tokenizer.decode(ids)
        got = tokenizer.encode(text)
        if best is None or abs(len(got) - target) < abs(best[1] - target):
            best = (text, len(got))
        if len(got) == target:
            break
        ids = got[:target] if len(got) > target else got + _draw_ids(rng, pool, target - len(got))
    assert best is not None
    return best


def _chat_count(tokenizer: Tokenizer, messages: Sequence[dict[str, str]]) -> int:
    return sum(len(tokenizer.encode(m["content"])) for m in messages)
