"""Deterministic output text: a pure function of (prompt, position).

Every correct configuration serves the same greedy text for the same prompt, which is what
a correctness gate compares; a configuration that corrupts activations (LL128 over PCIe)
serves garbage. Token counting is by whitespace-separated words so that the load generator
can size prompts without a tokenizer.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

VOCAB = (
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "had",
    "they",
    "you",
    "were",
    "their",
    "one",
    "all",
    "we",
    "can",
    "her",
    "has",
    "there",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "model",
    "token",
    "kernel",
    "expert",
    "memory",
    "batch",
    "layer",
    "cache",
    "server",
    "latency",
    "throughput",
    "decode",
    "prefill",
    "router",
    "graph",
    "split",
)
GARBAGE = ("\ufffd", "ĠĠ", "@@", "<|", "ÃÂ", "\u200b", "##", "ï¿½", "$$", "\\x00", "Ċ", "~~")
EOS_ONE_IN = 512  # chance per position that greedy decoding ends (without ignore_eos)
EOS_MIN_POSITION = 8
_MASK = (1 << 64) - 1


def prompt_tokens(prompt: str | Sequence[int]) -> int:
    """Prompt length in tokens: list length for token ids, else whitespace words (min 1)."""
    if isinstance(prompt, str):
        return max(1, len(prompt.split()))
    return max(1, len(prompt))


def prompt_units(prompt: str | Sequence[int]) -> Sequence[int] | Sequence[str]:
    """The tokens :func:`prompt_tokens` counts, for the prefix cache: the token ids, or the
    whitespace-separated words of a text prompt."""
    return prompt.split() if isinstance(prompt, str) else prompt


def prompt_key(prompt: str | Sequence[int]) -> int:
    """A stable (process-independent) 32-bit key of a prompt."""
    if isinstance(prompt, str):
        data = prompt.encode("utf-8", "surrogatepass")
    else:
        data = ",".join(str(int(t)) for t in prompt).encode()
    return zlib.crc32(data)


def _mix(key: int, position: int) -> int:
    # splitmix64 finaliser: cheap, well distributed, deterministic everywhere
    z = (key * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def token(key: int, position: int, *, wrong: bool = False) -> str:
    """The text of output token ``position`` (with its leading space)."""
    h = _mix(key, position)
    if wrong:
        return GARBAGE[h % len(GARBAGE)] + GARBAGE[(h >> 8) % len(GARBAGE)]
    return " " + VOCAB[h % len(VOCAB)]


def tokens(key: int, start: int, count: int, *, wrong: bool = False) -> str:
    """Concatenated text of output tokens ``start .. start+count-1``."""
    return "".join([token(key, p, wrong=wrong) for p in range(start, start + count)])


def is_eos(key: int, position: int, *, wrong: bool = False) -> bool:
    """Whether greedy decoding stops after token ``position`` (ignored with ignore_eos)."""
    if wrong or position < EOS_MIN_POSITION:
        return False
    return (_mix(key ^ 0x5A5A5A5A, position) >> 16) % EOS_ONE_IN == 0


def greedy_text(
    prompt: str | Sequence[int], max_tokens: int, *, ignore_eos: bool = True, wrong: bool = False
) -> str:
    """The full greedy output a correct server returns (reference for tests and gates)."""
    key = prompt_key(prompt)
    out = []
    for p in range(max_tokens):
        out.append(token(key, p, wrong=wrong))
        if not ignore_eos and is_eos(key, p, wrong=wrong):
            break
    return "".join(out)
