"""Tokenizers that prompts are counted and built with, and the vocabulary random prompts use.

Part of :mod:`autotune.loadgen.datasets` (import from there; this module is its implementation).
:func:`load_tokenizer` gives the word-level stand-in (:class:`WordTokenizer`) or a local real
tokenizer (``tokenizers`` or ``transformers``, never a hub), all counting content tokens only;
:func:`_pools` gives the id pools random prompts draw from. Every dataset kind counts tokens
through these, so they sit apart from the kinds; :data:`TOKEN_ID_RANGE` and
:data:`PROMPT_WORDS` live here because the word tokenizer is defined by them.
"""

from __future__ import annotations

import contextlib
import os
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from autotune.errors import ConfigError

TOKEN_ID_RANGE = (1000, 30000)
"""Random prompt token ids stay inside every common vocabulary and away from specials
(half-open, like ``numpy``'s ``integers``: 1000 <= id < 30000)."""
_WORD_TEXT = (
    "time person year way day thing man world life hand part child eye woman place work "
    "week case point government company number group problem fact water room mother area "
    "money story month lot right study book word business issue side kind head house "
    "service friend father power hour game line end member law car city community name "
    "president team minute idea kid body information back parent face others level office "
    "door health art war history party result change morning reason research girl guy "
    "moment air teacher force education river stone light garden music cloud paper"
)
PROMPT_WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())
"""The words of text prompts; a word-level test tokenizer holds each as one token."""


class Tokenizer(Protocol):
    """What datasets need of a tokenizer: content tokens, no special tokens added."""

    name: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class WordTokenizer:
    """Whitespace-separated words are tokens: the stand-in when no tokenizer is given.

    Ids lie in :data:`TOKEN_ID_RANGE` (so token-id prompts are valid for any real model):
    ``PROMPT_WORDS[k]`` is ``1000 + k`` and any other word a stable hash above those, so the
    word count is the token count and ``decode(encode(text)) == text`` for text of
    :data:`PROMPT_WORDS`; ``decode`` maps every id to one of those words.
    """

    name = "words"

    def __init__(self) -> None:
        self._index = {word: k for k, word in enumerate(PROMPT_WORDS)}

    def encode(self, text: str) -> list[int]:
        low, high = TOKEN_ID_RANGE
        known = len(PROMPT_WORDS)
        return [
            low + self._index[w]
            if w in self._index
            else low + known + zlib.crc32(w.encode()) % (high - low - known)
            for w in text.split()
        ]

    def decode(self, ids: Sequence[int]) -> str:
        low = TOKEN_ID_RANGE[0]
        return " ".join(PROMPT_WORDS[(int(i) - low) % len(PROMPT_WORDS)] for i in ids)


class _LoadedTokenizer:
    """A real tokenizer, with the id pools random prompts draw from (computed once)."""

    def __init__(self, tok: Any, name: str) -> None:
        self._tok = tok
        self.name = name
        self._pools: tuple[np.ndarray, np.ndarray] | None = None

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def _ordinary(self) -> list[int]:
        raise NotImplementedError

    def _decode_each(self, ids: list[int]) -> list[str]:
        return [self.decode([i]) for i in ids]

    def _encode_each(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def pools(self) -> tuple[np.ndarray, np.ndarray]:
        """(ordinary ids: the vocabulary minus special and added tokens; text-safe ids: those
        of them that decode to valid text re-encoding to just themselves). Token-id prompts
        draw from the first; text prompts from the second, whose decoded joins re-encode
        close to their length (a byte fragment that decodes to U+FFFD never does)."""
        if self._pools is None:
            ordinary = self._ordinary()
            texts = self._decode_each(ordinary)
            encoded = self._encode_each(texts)
            safe = [
                i
                for i, text, again in zip(ordinary, texts, encoded, strict=True)
                if "\ufffd" not in text and again == [i]
            ]
            self._pools = (np.asarray(ordinary, np.int64), np.asarray(safe or ordinary, np.int64))
        return self._pools


class _FastTokenizer(_LoadedTokenizer):
    """A ``tokenizers`` ``Tokenizer`` (a tokenizer.json)."""

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode([int(i) for i in ids], skip_special_tokens=False))

    def _ordinary(self) -> list[int]:
        vocab = set(self._tok.get_vocab(with_added_tokens=True).values())
        vocab -= set(self._tok.get_added_tokens_decoder())
        unk = getattr(self._tok.model, "unk_token", None)
        if unk is not None and self._tok.token_to_id(unk) is not None:
            vocab.discard(self._tok.token_to_id(unk))
        return sorted(vocab)

    def _decode_each(self, ids: list[int]) -> list[str]:
        return list(self._tok.decode_batch([[i] for i in ids], skip_special_tokens=False))

    def _encode_each(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]


class _TransformersTokenizer(_LoadedTokenizer):
    """A ``transformers`` tokenizer loaded from a local directory."""

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode([int(i) for i in ids]))

    def _ordinary(self) -> list[int]:
        vocab = set(self._tok.get_vocab().values())
        vocab -= set(getattr(self._tok, "all_special_ids", ()))
        vocab -= set(getattr(self._tok, "added_tokens_decoder", {}))
        unk = getattr(self._tok, "unk_token_id", None)
        vocab.discard(unk)
        return sorted(vocab)


def load_tokenizer(path: str | Path | None) -> Tokenizer:
    """The tokenizer prompts are counted and built with.

    None: :class:`WordTokenizer`. A ``tokenizer.json`` file, or a directory holding one: the
    ``tokenizers`` package reads it. A directory without one (or without ``tokenizers``
    installed): ``transformers.AutoTokenizer`` with ``local_files_only``. Never a hub: a
    benchmark must not depend on the network, so ``HF_HUB_OFFLINE=1`` is set while it loads,
    and only then: autotune's environment is what local services inherit, and a variable
    that appeared at the first measurement would show in the trial records as a change of
    environment between the first trial and the rest (:mod:`autotune.trial.inherited_env`).
    """
    if path is None:
        return WordTokenizer()
    with _hub_offline():
        return _load(path)


@contextlib.contextmanager
def _hub_offline() -> Iterator[None]:
    before = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = before


def _load(path: str | Path) -> Tokenizer:
    where = Path(path).expanduser()
    expected = (
        "expected a tokenizer.json file, or a local directory holding tokenizer.json or a "
        "tokenizer saved by transformers (tokenizers are never fetched from a hub)"
    )
    if not where.exists():
        raise ConfigError(f"no such file or directory; {expected}", file=str(path))
    problems: list[str] = []
    file = where if where.is_file() else where / "tokenizer.json"
    if file.is_file():
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError:
            problems.append("the 'tokenizers' package is not installed")
        else:
            try:
                return _FastTokenizer(HFTokenizer.from_file(str(file)), str(path))
            except Exception as exc:  # tokenizers raises plain Exception for a bad file
                problems.append(f"tokenizers cannot read {file.name}: {_first_line(exc)}")
    else:
        problems.append("it holds no tokenizer.json")
    if where.is_dir():
        try:
            from transformers import AutoTokenizer
        except ImportError:
            problems.append("transformers is not installed")
        else:
            try:
                tok = AutoTokenizer.from_pretrained(str(where), local_files_only=True)
                return _TransformersTokenizer(tok, str(path))
            except Exception as exc:  # OSError, ValueError, ... from any tokenizer class
                problems.append(f"transformers cannot load it: {_first_line(exc)}")
    raise ConfigError(f"not a usable tokenizer ({'; '.join(problems)}); {expected}", file=str(path))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _pools(tokenizer: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """(ids for token-id prompts, ids for text prompts): :data:`TOKEN_ID_RANGE` for the word
    tokenizer, :meth:`_LoadedTokenizer.pools` for a real one, and for any other implementation
    of the protocol the ids of its encoding of :data:`PROMPT_WORDS` (valid by construction)."""
    if isinstance(tokenizer, WordTokenizer):
        every = np.arange(*TOKEN_ID_RANGE)
        return every, every
    if isinstance(tokenizer, _LoadedTokenizer):
        ordinary, safe = tokenizer.pools()
    else:
        ids = sorted(set(tokenizer.encode(" ".join(PROMPT_WORDS))))
        ordinary = safe = np.asarray(ids, np.int64)
    if not len(ordinary):
        raise ConfigError("the tokenizer has no ordinary (non-special) tokens", file=tokenizer.name)
    return ordinary, safe
