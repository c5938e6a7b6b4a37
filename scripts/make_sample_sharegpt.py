"""Write the bundled ShareGPT-format sample, ``autotune/loadgen/data/sharegpt_sample.json``.

No data set can be downloaded on these machines, so the sample that the ShareGPT loader's
tests and a first run use is generated: seeded (the same file on every run), 200
conversations of 1-4 exchanges, questions and answers made of simple English sentences from a
small grammar, with lengths spread like chat traffic (many short questions, some long ones,
answers several times longer than their question). A few conversations open with a system
turn, a few questions are too short or too long for bench_serving's default filters (fewer
than 4 tokens, more than 1024), so the filters have something to drop.

    python3 scripts/make_sample_sharegpt.py            # rewrites the bundled file
    python3 scripts/make_sample_sharegpt.py --out x.json --conversations 50 --seed 3
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


OUT = Path(__file__).resolve().parents[1] / "autotune" / "loadgen" / "data" / "sharegpt_sample.json"

DETERMINERS = _words("the a this that every my our your some each")
ADJECTIVES = _words(
    "small large simple quick careful new old useful common strange local remote busy quiet "
    "early late clear broken stable fast slow cheap modern long short safe hidden shared "
    "empty full"
)
NOUNS = _words(
    "server garden report recipe question answer program teacher river machine budget "
    "project letter window meeting schedule kitchen map engine library student market story "
    "network bridge problem plan computer city team idea method result system cache queue "
    "file database model request customer neighbor bicycle song painting experiment lesson "
    "village battery picture contract forest message"
)
VERBS = _words(
    "explains improves needs changes supports describes breaks follows requires keeps "
    "builds measures replaces connects protects finds shows reduces handles starts stops "
    "checks moves shapes tests"
)
ADVERBS = _words(
    "quickly carefully often rarely usually clearly slowly easily always sometimes probably "
    "simply mostly hardly"
)
PREPOSITIONS = _words("in on near with without after before under behind")
TOPICS = (
    "cook rice",
    "write a cover letter",
    "learn a new language",
    "plan a small garden",
    "speed up a slow database",
    "train for a marathon",
    "save money on groceries",
    "explain recursion to a child",
    "fix a leaking tap",
    "choose a laptop",
    "sort a list",
    "start a book club",
    "tune a web server",
    "paint a room",
    "read a bus timetable",
    "write a short poem",
    "compare two loans",
    "clean a bicycle chain",
    "debug a program",
)
OPENERS = (
    "How do I {t}?",
    "Can you explain how to {t}?",
    "What is the best way to {t}?",
    "I want to {t}. Where should I start?",
    "Is it hard to {t}?",
    "Give me tips to {t}.",
)
FOLLOW_UPS = (
    "Can you say more about that?",
    "What if {s}?",
    "Why does {s}?",
    "Thanks. And {s}?",
    "That helps. Could you give an example where {s}?",
    "Is there a simpler way?",
)
ANSWER_OPENERS = (
    "Sure.",
    "Good question.",
    "Here is a short answer.",
    "It depends on a few things.",
    "Let me explain step by step.",
    "There are several ways to do this.",
)
SYSTEM_PROMPTS = (
    "You are a helpful assistant. Answer clearly and briefly.",
    "You are a patient teacher who explains things step by step.",
    "You are a careful engineer. Prefer simple and safe solutions.",
)


def noun_phrase(rng: random.Random) -> str:
    words = [rng.choice(DETERMINERS)]
    if rng.random() < 0.5:
        words.append(rng.choice(ADJECTIVES))
    words.append(rng.choice(NOUNS))
    return " ".join(words)


def clause(rng: random.Random) -> str:
    parts = [noun_phrase(rng)]
    if rng.random() < 0.3:
        parts.append(rng.choice(ADVERBS))
    parts += [rng.choice(VERBS), noun_phrase(rng)]
    if rng.random() < 0.4:
        parts += [rng.choice(PREPOSITIONS), noun_phrase(rng)]
    return " ".join(parts)


def sentence(rng: random.Random) -> str:
    text = clause(rng)
    if rng.random() < 0.25:
        text += rng.choice((", and ", ", but ", " because ", " so ")) + clause(rng)
    return text[0].upper() + text[1:] + "."


def paragraph(rng: random.Random, words: int) -> str:
    """Sentences until about ``words`` words."""
    out: list[str] = []
    count = 0
    while count < words:
        s = sentence(rng)
        out.append(s)
        count += len(s.split())
    return " ".join(out)


def length(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    """Log-normal lengths: chat traffic has many short turns and a long tail."""
    return max(lo, min(hi, round(rng.lognormvariate(0, sigma) * median)))


def question(rng: random.Random, first: bool) -> str:
    if first:
        head = rng.choice(OPENERS).format(t=rng.choice(TOPICS))
    else:
        head = rng.choice(FOLLOW_UPS).format(s=clause(rng))
    extra = length(rng, 12, 1.0, 0, 400)
    return head if extra < 4 else f"{head} {paragraph(rng, extra)}"


def answer(rng: random.Random) -> str:
    return f"{rng.choice(ANSWER_OPENERS)} {paragraph(rng, length(rng, 40, 0.7, 8, 500))}"


def conversation(rng: random.Random, index: int) -> dict[str, object]:
    turns: list[dict[str, str]] = []
    if rng.random() < 0.1:
        turns.append({"from": "system", "value": rng.choice(SYSTEM_PROMPTS)})
    for exchange in range(rng.choice((1, 1, 1, 2, 2, 3, 4))):
        turns.append({"from": "human", "value": question(rng, first=exchange == 0)})
        turns.append({"from": "gpt", "value": answer(rng)})
    return {"id": f"sample-{index:04d}", "conversations": turns}


def build(conversations: int, seed: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    data = [conversation(rng, i) for i in range(conversations)]
    if conversations < 14:
        return data
    # Edge cases for the filters, at fixed places so that every seed has them.
    human = {"from": "human", "value": "Hi!"}
    data[7]["conversations"] = [human, {"from": "gpt", "value": answer(rng)}]
    data[11]["conversations"] = [
        {"from": "human", "value": question(rng, first=True) + " " + paragraph(rng, 1100)},
        {"from": "gpt", "value": answer(rng)},
    ]
    data[13]["conversations"] = [
        {"from": "human", "value": question(rng, first=True)},
        {"from": "gpt", "value": "Yes."},
    ]
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    data = build(args.conversations, args.seed)
    # One conversation a line: a small file that diffs well.
    text = "[\n" + ",\n".join(json.dumps(c, ensure_ascii=False) for c in data) + "\n]\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"{args.out}: {len(data)} conversations, {len(text.encode()) / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
