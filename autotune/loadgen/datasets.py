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
"""

from __future__ import annotations

import json
import os
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

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
SAMPLE_SHAREGPT = Path(__file__).resolve().parent / "data" / "sharegpt_sample.json"
"""A generated ShareGPT-format file shipped with autotune (``scripts/make_sample_sharegpt.py``):
200 conversations, for tests and for a first run where no real data set can be fetched."""

_MAX_TOKENS = 1 << 20  # the cap LoadSpec puts on lengths: prompts are built in memory
_FIT_ROUNDS = 8
_SEPARATOR = "\n\n"  # bench_serving joins system prompt and question, and we join history turns
_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",  # aliases found in public ShareGPT dumps
    "bing": "assistant",
    "bard": "assistant",
    "system": "system",
}


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


# --- tokenizers -----------------------------------------------------------------------------


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
    benchmark must not depend on the network, so ``HF_HUB_OFFLINE=1`` is set first.
    """
    if path is None:
        return WordTokenizer()
    where = Path(path).expanduser()
    expected = (
        "expected a tokenizer.json file, or a local directory holding tokenizer.json or a "
        "tokenizer saved by transformers (tokenizers are never fetched from a hub)"
    )
    if not where.exists():
        raise ConfigError(f"no such file or directory; {expected}", file=str(path))
    os.environ["HF_HUB_OFFLINE"] = "1"
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


# --- building -------------------------------------------------------------------------------


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


# --- ShareGPT -------------------------------------------------------------------------------


def _load_sharegpt(path: Path) -> list[list[tuple[str, str]]]:
    """Each conversation as ``(role, text)`` turns, roles ``user``/``assistant``/``system``."""
    file = str(path)
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            "no such file (expected a ShareGPT-format JSON file)", file=file
        ) from None
    except IsADirectoryError:
        raise ConfigError(
            "is a directory (expected a ShareGPT-format JSON file)", file=file
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", file=file) from None
    except OSError as exc:
        raise ConfigError(f"cannot be read: {exc.strerror or exc}", file=file) from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", file=file
        ) from None
    if not isinstance(data, list):
        raise ConfigError(
            f"expected a JSON list of conversations, got {_json_type(data)}", file=file
        )
    conversations = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise ConfigError(
                f"expected an object with 'conversations', got {_json_type(entry)}",
                file=file,
                field=f"[{i}]",
            )
        key = "conversations" if "conversations" in entry else "conversation"
        turns = entry.get(key)
        if not isinstance(turns, list):
            got = "nothing" if turns is None else _json_type(turns)
            raise ConfigError(
                f"expected a list of turns, got {got}", file=file, field=f"[{i}].conversations"
            )
        conversation = []
        for j, turn in enumerate(turns):
            where = f"[{i}].{key}[{j}]"
            if not isinstance(turn, dict):
                raise ConfigError(
                    f"expected an object with 'from' and 'value', got {_json_type(turn)}",
                    file=file,
                    field=where,
                )
            role = turn.get("from")
            if not isinstance(role, str) or role not in _ROLES:
                raise ConfigError(
                    f"unknown speaker {role!r}",
                    file=file,
                    field=f"{where}.from",
                    allowed=list(_ROLES),
                )
            value = turn.get("value")
            if not isinstance(value, str):
                got = "nothing" if value is None else _json_type(value)
                raise ConfigError(
                    f"expected a string, got {got}", file=file, field=f"{where}.value"
                )
            conversation.append((_ROLES[role], value))
        conversations.append(conversation)
    return conversations


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), "a number")


def _exchanges(
    conversation: list[tuple[str, str]], turns: str
) -> Iterator[tuple[list[tuple[str, str]], str]]:
    """(context ending with the user turn, the answer after it) for each request."""
    for k, (role, _) in enumerate(conversation):
        if role != "user" or k + 1 == len(conversation) or conversation[k + 1][0] != "assistant":
            continue
        if turns == "first":
            context = [turn for turn in conversation[:k] if turn[0] == "system"]
            yield [*context, conversation[k]], conversation[k + 1][1]
            return
        yield conversation[: k + 1], conversation[k + 1][1]


def _sharegpt_prompts(
    spec: ShareGPTDataset,
    count: int,
    seed: int,
    form: str,
    chat: bool,
    tokenizer: Tokenizer,
) -> list[Prompt]:
    """bench_serving's order of work: shuffle the conversations with the seed, then take
    requests that pass the filters until ``count`` (only as much as needed is tokenized);
    fewer usable requests than ``count`` are cycled in the same order."""
    conversations = _load_sharegpt(spec.path)
    order = _rng(seed).permutation(len(conversations))
    dropped: Counter[str] = Counter()
    prompts: list[Prompt] = []
    for c in order:
        for context, answer in _exchanges(conversations[int(c)], spec.turns):
            prompt = _sharegpt_prompt(spec, context, answer, form, chat, tokenizer, dropped)
            if prompt is not None:
                prompts.append(prompt)
                if len(prompts) == count:
                    return prompts
    if not prompts:
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(dropped.items())) or (
            "no conversation has a human turn followed by a gpt turn"
        )
        raise ConfigError(
            f"no usable request after the filters ({len(conversations)} conversations; "
            f"dropped: {why})",
            file=str(spec.path),
        )
    return [prompts[i % len(prompts)] for i in range(count)]


def _sharegpt_prompt(
    spec: ShareGPTDataset,
    context: list[tuple[str, str]],
    answer: str,
    form: str,
    chat: bool,
    tokenizer: Tokenizer,
    dropped: Counter[str],
) -> Prompt | None:
    text = _SEPARATOR.join(content for _, content in context)
    messages = tuple({"role": role, "content": content} for role, content in context)
    ids = tuple(tokenizer.encode(text)) if form == "token_ids" else None
    if chat:
        n_in = _chat_count(tokenizer, messages)
    else:
        n_in = len(ids) if ids is not None else len(tokenizer.encode(text))
    n_out = spec.output_len if spec.output_len is not None else len(tokenizer.encode(answer))
    from_data = spec.output_len is None
    if n_in < spec.min_len:
        dropped[f"prompts under {spec.min_len} tokens (min_len)"] += 1
    elif from_data and n_out < spec.min_len:
        dropped[f"answers under {spec.min_len} tokens (min_len)"] += 1
    elif spec.max_prompt_len is not None and n_in > spec.max_prompt_len:
        dropped[f"prompts over {spec.max_prompt_len} tokens (max_prompt_len)"] += 1
    elif from_data and spec.max_total_len is not None and n_in + n_out > spec.max_total_len:
        dropped[f"prompt + answer over {spec.max_total_len} tokens (max_total_len)"] += 1
    else:
        return Prompt(text, ids, messages if chat else None, n_in, n_out)
    return None


# --- shared prefix --------------------------------------------------------------------------


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


# --- summary --------------------------------------------------------------------------------


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
