from __future__ import annotations

from autotune.sim import text


def test_token_counting() -> None:
    assert text.prompt_tokens("a b  c\nd") == 4
    assert text.prompt_tokens("") == 1
    assert text.prompt_tokens([5, 6, 7]) == 3


def test_text_is_a_deterministic_function_of_prompt_and_position() -> None:
    a = text.greedy_text("hello world", 50)
    assert a == text.greedy_text("hello world", 50)
    assert a != text.greedy_text("hello world!", 50)
    assert text.greedy_text("hello world", 20) == a[: len(text.greedy_text("hello world", 20))]
    assert len(a.split()) == 50
    assert text.tokens(text.prompt_key("hello world"), 10, 5) == "".join(
        text.token(text.prompt_key("hello world"), p) for p in range(10, 15)
    )
    assert text.prompt_key([1, 2, 3]) == text.prompt_key([1, 2, 3]) != text.prompt_key([1, 2])


def test_wrong_text_is_garbage() -> None:
    good = text.greedy_text("the prompt", 30)
    bad = text.greedy_text("the prompt", 30, wrong=True)
    assert good != bad
    assert not set(bad.split()) & set(text.VOCAB)


def test_eos_only_without_ignore_eos() -> None:
    keys = [text.prompt_key(f"p{i}") for i in range(200)]
    stops = [next((p for p in range(4000) if text.is_eos(k, p)), None) for k in keys]
    assert all(s is None or s >= text.EOS_MIN_POSITION for s in stops)
    assert sum(s is not None for s in stops) > 150
    short = text.greedy_text("p1", 4000, ignore_eos=False)
    assert len(short.split()) < 4000
