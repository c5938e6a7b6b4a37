"""Request datasets with real local tokenizers (autotune/loadgen/datasets.py): token counts
with a word-level and a byte-level ``tokenizers`` tokenizer, loaded offline from a directory or
a file, and the transformers fallback. Split from test_datasets.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from datasets_helpers import build

from autotune.errors import ConfigError
from autotune.loadgen import _tokenizer
from autotune.loadgen.datasets import (
    SAMPLE_SHAREGPT,
    RandomDataset,
    SharedPrefixDataset,
    ShareGPTDataset,
    WordTokenizer,
    load_tokenizer,
)

NO_TOKENIZERS = "the 'tokenizers' package is not installed in this environment"
NO_TRANSFORMERS = "transformers is not installed in this environment"


# --- tokenizers -------------------------------------------------------------------------------


def test_load_tokenizer_none_is_the_word_tokenizer() -> None:
    assert isinstance(load_tokenizer(None), WordTokenizer)


def test_load_tokenizer_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file or directory") as err:
        load_tokenizer(tmp_path / "missing")
    assert err.value.file == str(tmp_path / "missing")
    with pytest.raises(ConfigError, match="no such file"):
        load_tokenizer("meta-llama/Llama-3.1-8B-Instruct")  # a hub name is not a local path
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no tokenizer.json") as err:
        load_tokenizer(tmp_path / "empty")
    assert err.value.file == str(tmp_path / "empty")
    garbage = tmp_path / "tokenizer.json"
    garbage.write_text("{}", encoding="utf-8")
    with pytest.raises(ConfigError, match="not a usable tokenizer") as err:
        load_tokenizer(garbage)
    assert err.value.file == str(garbage) and "expected a tokenizer.json file" in str(err.value)


@pytest.fixture(scope="module")
def sample_texts() -> list[str]:
    data = json.loads(SAMPLE_SHAREGPT.read_text(encoding="utf-8"))
    return [turn["value"] for c in data for turn in c["conversations"]]


@pytest.fixture(scope="module")
def wordlevel(
    tmp_path_factory: pytest.TempPathFactory, sample_texts: list[str]
) -> tuple[Any, Path]:
    """A WordLevel tokenizer trained on the sample, saved as dir/tokenizer.json."""
    tk = pytest.importorskip("tokenizers", reason=NO_TOKENIZERS)
    tok = tk.Tokenizer(tk.models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = tk.pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        sample_texts, tk.trainers.WordLevelTrainer(special_tokens=["[UNK]", "<s>", "</s>"])
    )
    folder = tmp_path_factory.mktemp("wordlevel")
    tok.save(str(folder / "tokenizer.json"))
    return tok, folder


@pytest.fixture(scope="module")
def bytelevel(
    tmp_path_factory: pytest.TempPathFactory, sample_texts: list[str]
) -> tuple[Any, Path]:
    """A GPT-2 style byte-level BPE (800 tokens) trained on the sample: decoded random ids
    do not always re-encode to as many tokens, the hard case for exact text lengths."""
    tk = pytest.importorskip("tokenizers", reason=NO_TOKENIZERS)
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=800,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(sample_texts, trainer)
    path = tmp_path_factory.mktemp("bytelevel") / "tokenizer.json"
    tok.save(str(path))
    return tok, path


def count(raw: Any, text: str) -> int:
    """The tokenizers package's own count, independent of datasets.py."""
    return len(raw.encode(text, add_special_tokens=False).ids)


def test_real_tokenizer_loads_from_dir_or_file_offline(wordlevel, monkeypatch) -> None:
    raw, folder = wordlevel
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    seen: list[str | None] = []
    real = _tokenizer._load

    def load(path: Any) -> Any:
        seen.append(os.environ.get("HF_HUB_OFFLINE"))
        return real(path)

    monkeypatch.setattr(_tokenizer, "_load", load)
    for where in (folder, folder / "tokenizer.json", str(folder)):
        tok = load_tokenizer(where)
        assert tok.encode("the server needs a plan") == raw.encode("the server needs a plan").ids
        assert tok.name == str(where)
    assert seen == ["1", "1", "1"]  # offline while it loads ...
    # ... and only then: local services inherit autotune's environment (inherited_env).
    assert "HF_HUB_OFFLINE" not in os.environ
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    load_tokenizer(folder)
    assert seen[-1] == "1" and os.environ["HF_HUB_OFFLINE"] == "0"


def test_sharegpt_counts_with_a_real_tokenizer(bytelevel) -> None:
    raw, path = bytelevel
    tok = load_tokenizer(path)
    spec = ShareGPTDataset(path=SAMPLE_SHAREGPT, turns="multi")
    data = json.loads(SAMPLE_SHAREGPT.read_text(encoding="utf-8"))
    answers = {t["value"] for c in data for t in c["conversations"] if t["from"] == "gpt"}
    prompts = build(spec, count=150, tokenizer=tok, form="token_ids")
    for p in prompts:
        assert p.input_tokens == count(raw, p.text) == len(p.token_ids or ())
        assert list(p.token_ids or ()) == raw.encode(p.text, add_special_tokens=False).ids
        assert 4 <= p.input_tokens <= 1024 and p.input_tokens + p.output_tokens <= 2048
    assert {p.output_tokens for p in prompts} <= {count(raw, a) for a in answers}
    chat = build(spec, count=150, tokenizer=tok, chat=True)
    for p in chat:
        assert p.input_tokens == sum(count(raw, m["content"]) for m in p.messages or ())
    # Byte-level BPE counts differ from word counts: the tokenizer was really used.
    assert [p.input_tokens for p in chat] != [
        p.input_tokens for p in build(spec, count=150, chat=True)
    ]


@pytest.mark.parametrize("which", ["wordlevel", "bytelevel"])
def test_random_prompts_with_a_real_tokenizer(which: str, request) -> None:
    raw, where = request.getfixturevalue(which)
    tok = load_tokenizer(where)
    specials = set(raw.get_added_tokens_decoder())
    vocab = raw.get_vocab_size(with_added_tokens=True)
    spec = RandomDataset(input_len=120, output_len=4, range_ratio=0.5)
    ids_form = build(spec, count=100, tokenizer=tok, form="token_ids")
    drawn = {i for p in ids_form for i in p.token_ids or ()}
    assert drawn and max(drawn) < vocab and not drawn & specials  # inside the vocab, no specials
    assert len(drawn) > 0.5 * (vocab - len(specials))  # spread over the vocabulary
    text_form = build(spec, count=100, tokenizer=tok)
    wanted = [p.input_tokens for p in ids_form]  # same seed: the same drawn lengths
    for p, target in zip(text_form, wanted, strict=True):
        assert p.input_tokens == count(raw, p.text)  # the real count, always
        assert abs(p.input_tokens - target) <= 2
    exact = sum(p.input_tokens == t for p, t in zip(text_form, wanted, strict=True))
    assert exact >= 98  # decode, re-encode, trim or pad: exact in practice (100/100 here)


def test_shared_prefix_with_a_real_tokenizer(bytelevel) -> None:
    raw, path = bytelevel
    tok = load_tokenizer(path)
    spec = SharedPrefixDataset(
        groups=4, prompts_per_group=5, system_prompt_len=200, question_len=20, output_len=8
    )
    chat = build(spec, count=20, tokenizer=tok, chat=True)
    systems: dict[int | None, str] = {}
    for p in chat:
        system, question = (m["content"] for m in p.messages or ())
        assert count(raw, system) == 200 and count(raw, question) == 20
        assert systems.setdefault(p.group, system) == system
        assert p.text.startswith(system + "\n\n") and p.input_tokens == 220
    plain = build(spec, count=20, tokenizer=tok)
    for p in plain:
        assert p.input_tokens == count(raw, p.text)  # the separator's tokens counted too
        assert p.text.startswith(systems[p.group] + "\n\n")
    ids = build(spec, count=20, tokenizer=tok, form="token_ids")
    prefixes: dict[int | None, tuple[int, ...]] = {}
    for p in ids:
        assert len(p.token_ids or ()) == 220 == p.input_tokens
        assert prefixes.setdefault(p.group, (p.token_ids or ())[:200]) == (p.token_ids or ())[:200]
    assert len(set(prefixes.values())) == 4
    assert not {i for p in ids for i in p.token_ids or ()} & set(raw.get_added_tokens_decoder())


@pytest.fixture(scope="module")
def transformers_dir(bytelevel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GPT-2 tokenizer as vocab.json + merges.txt and no tokenizer.json: only transformers
    can load it."""
    pytest.importorskip("transformers", reason=NO_TRANSFORMERS)
    raw, _ = bytelevel
    folder = tmp_path_factory.mktemp("gpt2")
    raw.model.save(str(folder))
    config = {
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def test_transformers_fallback(transformers_dir: Path, bytelevel) -> None:
    raw, _ = bytelevel
    tok = load_tokenizer(transformers_dir)
    assert type(tok._tok).__module__.startswith("transformers")  # type: ignore[attr-defined]
    text = "How do I tune a web server? Every quiet cache needs a plan."
    assert tok.encode(text) == raw.encode(text, add_special_tokens=False).ids
    prompts = build(RandomDataset(input_len=64), count=20, tokenizer=tok)
    assert all(p.input_tokens == count(raw, p.text) for p in prompts)
    assert sum(p.input_tokens == 64 for p in prompts) >= 19
    special = raw.token_to_id("<|endoftext|>")
    drawn = {
        i
        for p in build(RandomDataset(input_len=64), count=50, tokenizer=tok, form="token_ids")
        for i in p.token_ids or ()
    }
    assert special not in drawn
