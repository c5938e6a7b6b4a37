"""The ``sharegpt`` dataset kind: requests taken from real conversations in a JSON file.

Part of :mod:`autotune.loadgen.datasets` (import from there; this module is its implementation).
Reads and checks a ShareGPT-format file (errors name the file and the field), splits each
conversation into requests (the first human turn, or every turn with its history), and applies
bench_serving's and vLLM's filters on token counts. :data:`SAMPLE_SHAREGPT` is the sample file
shipped under ``data/`` beside this module. The only kind that reads a file, so it has its own
module.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from autotune.errors import ConfigError
from autotune.loadgen._dataset_models import Prompt, ShareGPTDataset
from autotune.loadgen._draw import _SEPARATOR, _chat_count, _rng
from autotune.loadgen._tokenizer import Tokenizer

SAMPLE_SHAREGPT = Path(__file__).resolve().parent / "data" / "sharegpt_sample.json"
"""A generated ShareGPT-format file shipped with autotune (``scripts/make_sample_sharegpt.py``):
200 conversations, for tests and for a first run where no real data set can be fetched."""
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
