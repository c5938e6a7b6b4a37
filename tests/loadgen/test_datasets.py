"""Request datasets (autotune/loadgen/datasets.py): determinism, the bench_serving definitions
(range ratio, ShareGPT filters, generated shared prefix), token counts with real local
tokenizers, and errors that name the file and the field."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from datasets_helpers import WORDS, build, conv, words
from pydantic import TypeAdapter, ValidationError

from autotune.errors import ConfigError
from autotune.loadgen.datasets import (
    PROMPT_WORDS,
    SAMPLE_SHAREGPT,
    TOKEN_ID_RANGE,
    DatasetSpec,
    Prompt,
    RandomDataset,
    SharedPrefixDataset,
    ShareGPTDataset,
    build_prompts,
    dataset_summary,
)

# --- shared constants -------------------------------------------------------------------------


def test_prompt_words_are_distinct() -> None:
    assert len(set(PROMPT_WORDS)) == len(PROMPT_WORDS) == 95  # distinct: one id each


def test_first_extends_a_shorter_build() -> None:
    for spec in (
        RandomDataset(input_len=32, output_len=8, range_ratio=0.5),
        SharedPrefixDataset(groups=3, prompts_per_group=4, system_prompt_len=16),
        ShareGPTDataset(path=SAMPLE_SHAREGPT),
    ):
        whole = build_prompts(spec, count=40, seed=4, form="text", chat=False, tokenizer=WORDS)
        tail = build_prompts(
            spec, first=25, count=15, seed=4, form="text", chat=False, tokenizer=WORDS
        )
        assert tail == whole[25:]


def test_word_tokenizer_counts_words_and_round_trips_prompt_words() -> None:
    text = " ".join(PROMPT_WORDS)
    ids = WORDS.encode(text)
    assert len(ids) == len(PROMPT_WORDS)
    assert all(TOKEN_ID_RANGE[0] <= i < TOKEN_ID_RANGE[1] for i in ids)
    assert WORDS.decode(ids) == text
    other = WORDS.encode("Kubernetes  pods\nrestart")
    assert len(other) == 3 and all(TOKEN_ID_RANGE[0] + 95 <= i < TOKEN_ID_RANGE[1] for i in other)
    assert other == WORDS.encode("Kubernetes pods restart")  # stable, not Python's salted hash
    assert set(WORDS.decode([5, -3, 10**9]).split()) <= set(PROMPT_WORDS)


def test_dataset_spec_picks_the_kind_and_forbids_unknown_fields() -> None:
    adapter: TypeAdapter[Any] = TypeAdapter(DatasetSpec)
    spec = adapter.validate_python({"kind": "sharegpt", "path": "x.json", "turns": "multi"})
    assert isinstance(spec, ShareGPTDataset) and spec.path == Path("x.json")
    assert isinstance(adapter.validate_python({"kind": "random"}), RandomDataset)
    gsp = adapter.validate_python({"kind": "shared_prefix", "groups": 2})
    assert isinstance(gsp, SharedPrefixDataset) and gsp.prompts_per_group == 16
    for bad in (
        {"kind": "random", "input_lenn": 5},
        {"kind": "random", "range_ratio": 1.5},
        {"kind": "sonnet"},
        {"input_len": 5},
        {"kind": "sharegpt", "path": "x.json", "turns": "all"},
    ):
        with pytest.raises(ValidationError):
            adapter.validate_python(bad)


# --- determinism ------------------------------------------------------------------------------

SPECS = [
    RandomDataset(input_len=40, output_len=8, range_ratio=0.5),
    ShareGPTDataset(path=SAMPLE_SHAREGPT),
    ShareGPTDataset(path=SAMPLE_SHAREGPT, turns="multi"),
    SharedPrefixDataset(
        groups=3, prompts_per_group=4, system_prompt_len=30, question_len=5, output_len=7
    ),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.kind}-{getattr(s, 'turns', '')}")
@pytest.mark.parametrize(("form", "chat"), [("token_ids", False), ("text", False), ("text", True)])
def test_equal_inputs_equal_prompts_and_seed_matters(spec: Any, form: str, chat: bool) -> None:
    first = build(spec, count=30, seed=7, form=form, chat=chat)
    assert len(first) == 30
    assert first == build(spec, count=30, seed=7, form=form, chat=chat)
    assert first != build(spec, count=30, seed=8, form=form, chat=chat)
    # Prompt i does not depend on count: a longer run extends a shorter one.
    assert build(spec, count=10, seed=7, form=form, chat=chat) == first[:10]
    if form == "token_ids":
        assert all(p.token_ids is not None and len(p.token_ids) == p.input_tokens for p in first)
    else:
        assert all(p.token_ids is None for p in first)
    assert all((p.messages is not None) == chat for p in first)


def test_count_zero_and_token_ids_with_chat() -> None:
    assert build(RandomDataset(), count=0) == []
    with pytest.raises(ConfigError) as err:
        build(RandomDataset(), form="token_ids", chat=True)
    assert err.value.field == "prompt" and "completions" in str(err.value)


# --- random -----------------------------------------------------------------------------------


def test_range_ratio_bounds_and_uniform_spread() -> None:
    # sglang: uniform over the integers [max(int(len * ratio), 1), len].
    spec = RandomDataset(input_len=400, output_len=40, range_ratio=0.25)
    prompts = build(spec, count=6000, seed=3)
    ins = np.array([p.input_tokens for p in prompts])
    outs = np.array([p.output_tokens for p in prompts])
    assert ins.min() == 100 and ins.max() == 400  # both ends reached, nothing outside
    assert outs.min() == 10 and outs.max() == 40
    assert all(len(p.text.split()) == p.input_tokens for p in prompts)
    # Uniform: 10 equal bins of [100, 400) hold 10% each (+-20% of that), mean in the middle.
    counts, _ = np.histogram(ins, bins=10, range=(100, 400))
    assert counts.min() > 0.08 * len(ins) and counts.max() < 0.12 * len(ins)
    assert abs(ins.mean() - 250) < 5
    # Input and output lengths are drawn independently.
    assert abs(np.corrcoef(ins, outs)[0, 1]) < 0.05


def test_range_ratio_floor_and_fixed_and_zero() -> None:
    small = build(RandomDataset(input_len=10, output_len=3, range_ratio=0.35), count=400)
    assert {p.input_tokens for p in small} == set(range(3, 11))  # int(3.5) = 3
    assert {p.output_tokens for p in small} == {1, 2, 3}  # max(int(1.05), 1) = 1
    fixed = build(RandomDataset(input_len=17, output_len=5), count=50)
    assert {(p.input_tokens, p.output_tokens) for p in fixed} == {(17, 5)}
    zero = build(RandomDataset(input_len=6, output_len=2, range_ratio=0.0), count=300)
    assert {p.input_tokens for p in zero} == set(range(1, 7))


def test_random_token_ids_with_the_word_tokenizer_stay_in_the_safe_range() -> None:
    prompts = build(RandomDataset(input_len=500), count=40, form="token_ids")
    ids = np.array([i for p in prompts for i in p.token_ids or ()])
    assert ids.min() >= TOKEN_ID_RANGE[0] and ids.max() < TOKEN_ID_RANGE[1]
    assert ids.max() - ids.min() > 25000  # spread over the range, not a corner of it
    assert all(p.text == WORDS.decode(p.token_ids or ()) for p in prompts)
    assert len({p.token_ids for p in prompts}) == 40


def test_random_text_and_chat() -> None:
    prompts = build(RandomDataset(input_len=64), count=10, chat=True)
    for p in prompts:
        assert p.messages == ({"role": "user", "content": p.text},)
        assert len(p.text.split()) == 64 and set(p.text.split()) <= set(PROMPT_WORDS)
        assert p.group is None


# --- ShareGPT ---------------------------------------------------------------------------------


def test_sharegpt_first_turn_is_the_prompt_and_the_answer_sets_max_tokens(write_json) -> None:
    path = write_json(
        [
            conv(
                ("human", "how do I cook rice"), ("gpt", words(9)), ("human", "more"), ("gpt", "x")
            ),
            conv(("system", "be brief and kind"), ("human", "what is a cache"), ("gpt", words(6))),
            conv(("gpt", "hello there friend"), ("human", "tell me a story"), ("gpt", words(5))),
            conv(("human", "lonely question with no answer")),
        ]
    )
    prompts = build(ShareGPTDataset(path=path), count=3, chat=True)
    by_text = {p.text: p for p in prompts}
    assert set(by_text) == {
        "how do I cook rice",
        "be brief and kind\n\nwhat is a cache",
        "tell me a story",
    }
    assert by_text["how do I cook rice"].output_tokens == 9
    assert by_text["how do I cook rice"].messages == (
        {"role": "user", "content": "how do I cook rice"},
    )
    cached = by_text["be brief and kind\n\nwhat is a cache"]
    assert cached.messages == (
        {"role": "system", "content": "be brief and kind"},
        {"role": "user", "content": "what is a cache"},
    )
    assert cached.input_tokens == 8 and cached.output_tokens == 6
    assert by_text["tell me a story"].messages == ({"role": "user", "content": "tell me a story"},)
    # Completions: the same text, no messages; counted the same with the word tokenizer.
    plain = build(ShareGPTDataset(path=path), count=3)
    assert sorted(p.text for p in plain) == sorted(by_text) and all(
        p.messages is None for p in plain
    )


def test_sharegpt_multi_turn_carries_the_history(write_json) -> None:
    path = write_json(
        [
            conv(
                ("human", "first question here please"),
                ("gpt", words(5, "answer")),
                ("human", "second question here please"),
                ("gpt", words(6, "reply")),
                ("human", "third question here right now"),
                ("gpt", words(7, "done")),
            )
        ]
    )
    prompts: list[Prompt] = build(ShareGPTDataset(path=path, turns="multi"), count=3, chat=True)
    assert [len(p.messages or ()) for p in prompts] == [1, 3, 5]  # in conversation order
    last = prompts[2].messages or ()
    assert [m["role"] for m in last] == ["user", "assistant", "user", "assistant", "user"]
    assert last[-1]["content"] == "third question here right now"
    assert last[1]["content"] == words(5, "answer")  # the dataset's own answers as history
    assert prompts[1].messages == last[:3]
    assert [p.output_tokens for p in prompts] == [5, 6, 7]
    assert [p.input_tokens for p in prompts] == [4, 4 + 5 + 4, 4 + 5 + 4 + 6 + 5]
    assert dataset_summary(prompts)["multi_turn"] == 2
    plain = build(ShareGPTDataset(path=path, turns="multi"), count=3)
    assert plain[2].text == "\n\n".join(m["content"] for m in last)
    assert plain[2].input_tokens == prompts[2].input_tokens and plain[2].messages is None
    # "first" takes only the first exchange of the same file.
    first = build(ShareGPTDataset(path=path), count=2, chat=True)
    assert {len(p.messages or ()) for p in first} == {1}


def test_sharegpt_filters_follow_bench_serving(write_json) -> None:
    cases = {  # name: (prompt words, answer words)
        "short_prompt": (3, 50),
        "min_prompt": (4, 50),
        "short_answer": (50, 3),
        "min_answer": (50, 4),
        "max_prompt": (1024, 4),
        "long_prompt": (1025, 4),
        "max_total": (1000, 1048),
        "long_total": (1000, 1049),
    }
    data = [
        conv(("human", f"{name} " + words(p - 1)), ("gpt", words(a)))
        for name, (p, a) in cases.items()
    ]
    path = write_json(data)

    def kept(**fields: Any) -> set[str]:
        prompts = build(ShareGPTDataset(path=path, **fields), count=len(cases))
        return {p.text.split()[0] for p in prompts}

    assert kept() == {"min_prompt", "min_answer", "max_prompt", "max_total"}
    # A fixed output length: answers are not checked, nor prompt + answer (sglang's rule;
    # 1000 + 1100 tokens would fail vLLM's total limit); the prompt limits still are.
    assert kept(output_len=1100) == {
        "min_prompt",
        "short_answer",
        "min_answer",
        "max_prompt",
        "max_total",
        "long_total",
    }
    fixed = build(ShareGPTDataset(path=path, output_len=1100), count=8)
    assert {p.output_tokens for p in fixed} == {1100}
    # The limits are fields; None turns one off.
    assert kept(min_len=2, max_prompt_len=None, max_total_len=2100) == set(cases)
    assert kept(max_prompt_len=1000, max_total_len=None) == {
        "min_prompt",
        "min_answer",
        "max_total",
        "long_total",
    }


def test_sharegpt_shuffles_with_the_seed_and_cycles_when_short(write_json) -> None:
    path = write_json(
        [conv(("human", f"this is question number {k}"), ("gpt", words(8))) for k in range(3)]
    )
    prompts = build(ShareGPTDataset(path=path), count=10, seed=1)
    assert len({p.text for p in prompts[:3]}) == 3
    assert all(prompts[i] == prompts[i % 3] for i in range(10))  # same shuffled order again
    orders = {
        tuple(p.text for p in build(ShareGPTDataset(path=path), count=3, seed=s)) for s in range(12)
    }
    assert len(orders) > 3  # the seed picks the order (3! = 6 possible)
    sample = [build(ShareGPTDataset(path=SAMPLE_SHAREGPT), count=20, seed=s) for s in (0, 1)]
    assert [p.text for p in sample[0]] != [p.text for p in sample[1]]


def test_sample_file_is_usable_and_varied() -> None:
    prompts = build(ShareGPTDataset(path=SAMPLE_SHAREGPT), count=200)
    summary = dataset_summary(prompts)
    assert 180 <= summary["distinct"] < 200  # a few conversations fail the default filters
    assert summary["input_tokens"]["min"] >= 4 and summary["input_tokens"]["max"] <= 1024
    assert summary["input_tokens"]["max"] > 5 * summary["input_tokens"]["p50"]  # a long tail
    multi = build(ShareGPTDataset(path=SAMPLE_SHAREGPT, turns="multi"), count=400, chat=True)
    assert dataset_summary(multi)["multi_turn"] > 100
    assert SAMPLE_SHAREGPT.stat().st_size < 300_000


def test_sharegpt_accepts_the_conversation_key_and_role_aliases(write_json) -> None:
    path = write_json(
        [
            conv(("user", "alias user asks this"), ("chatgpt", words(5)), key="conversation"),
            conv(("human", "plain human asks this"), ("bing", words(5))),
        ]
    )
    assert {p.text for p in build(ShareGPTDataset(path=path), count=2)} == {
        "alias user asks this",
        "plain human asks this",
    }


def test_no_usable_conversation_names_the_file_and_why(write_json) -> None:
    path = write_json(
        [conv(("human", "hi"), ("gpt", words(50))), conv(("human", words(9)), ("gpt", "ok"))]
    )
    with pytest.raises(ConfigError) as err:
        build(ShareGPTDataset(path=path))
    text = str(err.value)
    assert err.value.file == str(path) and text.startswith(str(path))
    assert "prompts under 4 tokens (min_len)" in text and "answers under 4 tokens" in text
    only_humans = write_json([conv(("human", words(9)))], name="humans.json")
    with pytest.raises(ConfigError, match="human turn followed by a gpt turn"):
        build(ShareGPTDataset(path=only_humans))


@pytest.mark.parametrize(
    ("content", "field", "message"),
    [
        ("{not json", None, "not JSON: .* line 1 column 2"),
        ('{"conversations": []}', None, "expected a JSON list of conversations, got an object"),
        ("[[]]", "[0]", "expected an object with 'conversations', got a list"),
        ('[{"id": "a"}]', "[0].conversations", "expected a list of turns, got nothing"),
        ('[{"conversations": "hi"}]', "[0].conversations", "got a string"),
        ('[{"conversations": [3]}]', "[0].conversations[0]", "got a number"),
        (
            '[{"conversations": [{"from": "human", "value": "a"}, {"from": "robot"}]}]',
            "[0].conversations[1].from",
            "unknown speaker 'robot'",
        ),
        (
            '[{"conversations": [{"from": "gpt", "value": null}]}]',
            "[0].conversations[0].value",
            "got nothing",
        ),
        (
            '[{"conversations": [{"from": ["gpt"], "value": "x"}]}]',
            "[0].conversations[0].from",
            "unknown",
        ),
    ],
)
def test_bad_sharegpt_files_name_file_and_field(
    tmp_path: Path, content: str, field: str | None, message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=message) as err:
        build(ShareGPTDataset(path=path))
    assert err.value.file == str(path) and str(path) in str(err.value)
    assert err.value.field == field
    if field and field.endswith(".from"):
        assert {"human", "gpt", "system"} <= set(err.value.allowed or ())


def test_missing_unreadable_or_binary_sharegpt_file(tmp_path: Path) -> None:
    for path, message in [
        (tmp_path / "nope.json", "no such file"),
        (tmp_path, "is a directory"),
    ]:
        with pytest.raises(ConfigError, match=message) as err:
            build(ShareGPTDataset(path=path))
        assert err.value.file == str(path)
    binary = tmp_path / "latin1.json"
    binary.write_bytes(b'[{"conversations": "\xff"}]')
    with pytest.raises(ConfigError, match="not UTF-8"):
        build(ShareGPTDataset(path=binary))


# --- shared prefix ----------------------------------------------------------------------------


def test_shared_prefix_groups_share_an_exact_system_prompt() -> None:
    spec = SharedPrefixDataset(
        groups=5, prompts_per_group=6, system_prompt_len=40, question_len=7, output_len=9
    )
    prompts = build(spec, count=30, seed=2)
    assert Counter(p.group for p in prompts) == {g: 6 for g in range(5)}
    systems: dict[int | None, str] = {}
    for p in prompts:
        system, question = p.text.split("\n\n")
        assert len(system.split()) == 40 and len(question.split()) == 7
        assert systems.setdefault(p.group, system) == system  # one system prompt per group
        assert p.input_tokens == 47 and p.output_tokens == 9
    assert len(set(systems.values())) == 5
    assert len({p.text for p in prompts}) == 30  # every question differs
    groups_in_order = [p.group for p in prompts if p.group is not None]  # all: Counter above
    assert groups_in_order != sorted(groups_in_order)  # shuffled, like bench_serving
    assert dataset_summary(prompts)["groups"] == 5


def test_shared_prefix_cycles_and_cuts_to_count() -> None:
    spec = SharedPrefixDataset(
        groups=2, prompts_per_group=3, system_prompt_len=8, question_len=2, output_len=4
    )
    many = build(spec, count=20)
    assert all(many[i] == many[i % 6] for i in range(20)) and len(set(many[:6])) == 6
    assert build(spec, count=4) == many[:4]


def test_shared_prefix_token_ids_and_chat() -> None:
    spec = SharedPrefixDataset(
        groups=3, prompts_per_group=4, system_prompt_len=25, question_len=5, output_len=3
    )
    prompts = build(spec, count=12, form="token_ids")
    prefixes: dict[int | None, tuple[int, ...]] = {}
    for p in prompts:
        ids = p.token_ids or ()
        assert len(ids) == 30 == p.input_tokens
        assert prefixes.setdefault(p.group, ids[:25]) == ids[:25]
    assert len(set(prefixes.values())) == 3
    chat: list[Prompt] = build(spec, count=12, chat=True)
    for p in chat:
        system, user = p.messages or ()
        assert system["role"] == "system" and user["role"] == "user"
        assert p.text == f"{system['content']}\n\n{user['content']}"
        assert len(system["content"].split()) == 25
    assert len({(p.messages or ())[0]["content"] for p in chat}) == 3


def test_shared_prefix_defaults_are_bench_servings() -> None:
    spec = SharedPrefixDataset()
    assert (spec.groups, spec.prompts_per_group, spec.system_prompt_len) == (64, 16, 2048)
    assert (spec.question_len, spec.output_len) == (128, 256)


# --- summary ----------------------------------------------------------------------------------


def test_dataset_summary() -> None:
    prompts = [
        Prompt("a b", None, None, 2, 10),
        Prompt("c d e", (1, 2, 3), None, 3, 20, group=1),
        Prompt("c d e", (1, 2, 3), None, 3, 20, group=1),
        Prompt("f", None, ({"role": "user", "content": "f"},), 11, 30, group=4),
    ]
    summary = dataset_summary(prompts)
    assert summary["count"] == 4 and summary["distinct"] == 3
    assert summary["input_tokens"] == {"mean": 4.75, "min": 2, "max": 11, "p50": 3.0, "total": 19}
    assert summary["output_tokens"]["p50"] == 20.0
    assert (summary["groups"], summary["token_ids"], summary["chat"]) == (2, 2, 1)
    json.dumps(summary)  # ready for logs
    assert dataset_summary([])["input_tokens"] is None
