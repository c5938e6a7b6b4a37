"""The incremental SSE parser: framing rules and split-anywhere invariance."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.loadgen.sse import SSEEvent, SSEParser


def parse(*chunks: bytes) -> list[SSEEvent]:
    p = SSEParser()
    out: list[SSEEvent] = []
    for c in chunks:
        out.extend(p.feed(c))
    out.extend(p.close())
    return out


def datas(events: list[SSEEvent]) -> list[bytes]:
    return [e.data for e in events]


def test_events_and_done() -> None:
    raw = b'data: {"a":1}\n\ndata: {"b":2}\n\ndata: [DONE]\n\n'
    assert datas(parse(raw)) == [b'{"a":1}', b'{"b":2}', b"[DONE]"]


def test_feed_returns_events_as_soon_as_complete() -> None:
    p = SSEParser()
    assert p.feed(b"data: x") == []
    assert p.feed(b"\n") == []
    assert p.feed(b"\ndata: y\n\nda") == [SSEEvent(b"x"), SSEEvent(b"y")]
    assert p.feed(b"ta: z\n\n") == [SSEEvent(b"z")]


def test_field_rules() -> None:
    raw = (
        b": keep-alive comment\n"
        b"event: error\ndata:no-space\ndata:  two spaces\nid: 7\nretry: 10\n\n"
        b"data\n\n"
        b"\n\n"
    )
    assert parse(raw) == [SSEEvent(b"no-space\n two spaces", b"error"), SSEEvent(b"")]


def test_line_endings_cr_crlf_and_split_crlf() -> None:
    assert datas(parse(b"data: a\r\n\r\ndata: b\r\rdata: c\n\n")) == [b"a", b"b", b"c"]
    # '\r' then '\n' in the next read is ONE line end, not an empty line.
    assert datas(parse(b"data: a\r", b"\ndata: b\r\n\r\n")) == [b"a\nb"]
    assert datas(parse(b"data: a\r", b"\n", b"\r", b"\n")) == [b"a"]


def test_close_is_lenient_about_missing_blank_line() -> None:
    assert datas(parse(b"data: x\n\ndata: [DONE]")) == [b"x", b"[DONE]"]
    assert datas(parse(b"data: x\n\ndata: [DONE]\n")) == [b"x", b"[DONE]"]
    assert parse(b"") == []


line_text = st.text(
    alphabet=st.characters(exclude_characters="\r\n", exclude_categories=["Cs"]), max_size=12
)
event_st = st.tuples(
    st.lists(line_text, min_size=1, max_size=3),  # data lines
    st.sampled_from([b"\n", b"\r\n", b"\r"]),  # line terminator
    st.booleans(),  # preceded by a comment line
)


@settings(max_examples=300, deadline=None)
@given(events=st.lists(event_st, max_size=8), cuts=st.lists(st.integers(0, 400), max_size=12))
def test_arbitrary_split_points_give_identical_events(
    events: list[tuple[list[str], bytes, bool]], cuts: list[int]
) -> None:
    raw = b""
    expected: list[bytes] = []
    for lines, eol, comment in events:
        if comment:
            raw += b": ping" + eol
        for line in lines:
            raw += b"data: " + line.encode() + eol
        raw += eol
        expected.append("\n".join(lines).encode())
    points = sorted({c % (len(raw) + 1) for c in cuts})
    pieces = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    assert datas(parse(raw)) == expected
    assert datas(parse(*pieces)) == expected
    # byte-at-a-time, the worst case for CRLF handling
    assert datas(parse(*[raw[i : i + 1] for i in range(len(raw))])) == expected
