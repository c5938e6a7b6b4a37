"""Each dataset through the load generator, against a real HTTP server: what it sends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_openai_server import FakeServer

from autotune.errors import ConfigError
from autotune.loadgen import LoadSpec, run_load
from autotune.loadgen.datasets import (
    SAMPLE_SHAREGPT,
    build_prompts,
    load_tokenizer,
)


def spec(**kw: object) -> LoadSpec:
    base: dict[str, object] = {
        "concurrency": 4,
        "warmup_requests": 0,
        "requests": 24,
        "request_timeout_s": 20,
    }
    base.update(kw)
    return LoadSpec.from_mapping(base)


def test_random_range_ratio_varies_lengths_within_bounds(fake_server: FakeServer) -> None:
    load = spec(dataset={"kind": "random", "input_len": 40, "output_len": 10, "range_ratio": 0.5})
    result = run_load(fake_server.url, load)
    ins = [len(p["prompt"]) for p in fake_server.payloads]
    outs = [p["max_tokens"] for p in fake_server.payloads]
    assert all(20 <= n <= 40 for n in ins) and len(set(ins)) > 5
    assert all(5 <= n <= 10 for n in outs) and len(set(outs)) > 2
    # usage counts what was asked: ignore_eos gives each request exactly its max_tokens
    assert result.metrics.output_tokens == sum(outs)
    assert result.metrics.input_tokens == sum(ins)


def test_sharegpt_multi_turn_chat_sends_the_history(fake_server: FakeServer) -> None:
    dataset = {"kind": "sharegpt", "path": str(SAMPLE_SHAREGPT), "turns": "multi"}
    load = spec(api="chat", dataset=dataset, seed=3)
    run_load(fake_server.url, load)
    expected = build_prompts(
        load.requests_dataset,
        count=24,
        seed=3,
        form="text",
        chat=True,
        tokenizer=load_tokenizer(None),
    )
    sent = sorted(json.dumps([p["messages"], p["max_tokens"]]) for p in fake_server.payloads)
    assert sent == sorted(json.dumps([list(p.messages or ()), p.output_tokens]) for p in expected)
    sent_messages = [p["messages"] for p in fake_server.payloads]
    assert any(len(m) >= 3 for m in sent_messages)  # later turns carry the earlier ones
    assert all(m[-1]["role"] == "user" for m in sent_messages)


def test_shared_prefix_requests_share_their_groups_system_prompt(fake_server: FakeServer) -> None:
    dataset = {
        "kind": "shared_prefix",
        "groups": 3,
        "prompts_per_group": 4,
        "system_prompt_len": 64,
        "question_len": 8,
        "output_len": 4,
    }
    run_load(fake_server.url, spec(dataset=dataset, requests=12))
    heads = {tuple(p["prompt"][:64]) for p in fake_server.payloads}
    assert len(heads) == 3  # three groups, one system prompt each
    assert len({tuple(p["prompt"]) for p in fake_server.payloads}) == 12
    assert all(len(p["prompt"]) == 72 for p in fake_server.payloads)


def test_a_long_run_cycles_a_small_dataset_in_order(fake_server: FakeServer) -> None:
    dataset = {
        "kind": "shared_prefix",
        "groups": 2,
        "prompts_per_group": 2,
        "system_prompt_len": 4,
        "question_len": 4,
        "output_len": 2,
    }
    run_load(fake_server.url, spec(dataset=dataset, requests=10, concurrency=1))
    prompts = [tuple(p["prompt"]) for p in fake_server.payloads]
    assert prompts[4:8] == prompts[:4] and len(set(prompts)) == 4


def test_a_real_tokenizer_counts_the_prompt_lengths(
    fake_server: FakeServer, tmp_path: Path
) -> None:
    tk = pytest.importorskip("tokenizers")
    tok = tk.Tokenizer(tk.models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = tk.pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        ["alpha beta gamma delta, epsilon. zeta eta theta iota kappa"] * 3,
        tk.trainers.WordLevelTrainer(special_tokens=["[UNK]"]),
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    load = spec(prompt="text", tokenizer=str(tmp_path), dataset={"kind": "random", "input_len": 30})
    run_load(fake_server.url, load)
    vocab = set(tok.get_vocab()) - {"[UNK]"}
    for p in fake_server.payloads:
        assert len(tok.encode(p["prompt"], add_special_tokens=False).ids) == 30
        assert set(tok.encode(p["prompt"]).tokens) <= vocab


def test_lengths_belong_to_the_dataset() -> None:
    with pytest.raises(ConfigError) as err:
        spec(input_len=10, dataset={"kind": "random", "input_len": 20})
    assert err.value.field == "input_len" and "dataset" in str(err.value)
    with pytest.raises(ConfigError) as err:
        spec(dataset={"kind": "zipf"})
    assert err.value.field is not None and err.value.field.startswith("dataset")


def test_a_missing_sharegpt_file_is_named(fake_server: FakeServer, tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    load = spec(dataset={"kind": "sharegpt", "path": str(missing)})
    with pytest.raises(ConfigError) as err:
        run_load(fake_server.url, load)
    assert str(missing) in str(err.value) or err.value.file == str(missing)
