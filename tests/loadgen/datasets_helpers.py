"""Helpers of the dataset tests (test_datasets.py, test_dataset_tokenizers.py): prompts built
with the word tokenizer unless told otherwise, and ShareGPT conversations."""

from __future__ import annotations

from typing import Any

from autotune.loadgen.datasets import Prompt, WordTokenizer, build_prompts

WORDS = WordTokenizer()


def build(spec: Any, count: int = 20, seed: int = 0, **kw: Any) -> list[Prompt]:
    kw.setdefault("form", "text")
    kw.setdefault("chat", False)
    kw.setdefault("tokenizer", WORDS)
    return build_prompts(spec, count=count, seed=seed, **kw)


def words(n: int, word: str = "time") -> str:
    return " ".join([word] * n)


def conv(*turns: tuple[str, str], key: str = "conversations") -> dict[str, Any]:
    return {key: [{"from": who, "value": text} for who, text in turns]}
