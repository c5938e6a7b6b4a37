"""What the report tests share: the page's sections in order, a parser that collects them,
a section's text, and the headless Chromium that renders a report."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html import unescape
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

SECTIONS = [
    "summary",
    "explanation",
    "fleet",
    "pareto",
    "curves",
    "frontier",
    "history",
    "importance",
    "noise",
    "time",
    "failures",
    "top",
]
"""Every section, in the page's order; a study shows those it has something for."""
PLACEHOLDERS = [
    "No trial recorded a latency-throughput curve",
    "No explanation yet",
    "Needs at least 5 feasible",
    "No failed or infeasible trial",
    "No configuration was measured twice",
    "No completed trial yet",
    "No measured trial with throughput",
]
"""What the report used to show in a section it had nothing for: never again."""
PLOTS = ["plot-pareto", "plot-history", "plot-importance", "plot-time"]
PLANTED = '<script>alert("pwned")</script><i id="pwned">x</i>'
CHROMIUM = next(
    (p for p in (shutil.which("chromium"), "/usr/bin/chromium") if p and Path(p).exists()), None
)
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # the report must not need the network
    "--virtual-time-budget=10000",
]


class Page(HTMLParser):
    """Collects what the assertions need: sections with their text, ids, scripts, URLs."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.sections: dict[str, str] = {}
        self.ids: list[str] = []
        self.tags: dict[str, int] = {}
        self.urls: list[str] = []
        self._section: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] = self.tags.get(tag, 0) + 1
        a = dict(attrs)
        if a.get("id"):
            self.ids.append(str(a["id"]))
        for key in ("src", "href"):
            if a.get(key):
                self.urls.append(str(a[key]))
        if tag == "section":
            self._section = a.get("id")
            self.sections[str(self._section)] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self._section = None

    def handle_data(self, data: str) -> None:
        if self._section is not None:
            self.sections[self._section] += data


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def section_html(raw: str, anchor: str) -> str:
    start = raw.index(f'<section id="{anchor}">')
    return raw[start : raw.index("</section>", start)]


def section_text(raw: str, anchor: str) -> str:
    """The section's text with every tag a space (table cells stay apart), scripts left out."""
    body = re.sub(r"<script.*?</script>", " ", section_html(raw, anchor), flags=re.S)
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", body)).split())


def figure(raw: str, div_id: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The data and layout a plot's ``Plotly.newPlot`` call gets, as embedded in the page."""
    match = re.search(r'Plotly\.newPlot\(\s*"' + re.escape(div_id) + r'",\s*', raw)
    assert match is not None, div_id
    decoder = json.JSONDecoder()
    data, end = decoder.raw_decode(raw, match.end())
    comma = re.compile(r"\s*,\s*").match(raw, end)
    assert comma is not None
    layout, _ = decoder.raw_decode(raw, comma.end())
    return data, layout


def chromium_dom(page: Path, profile: Path) -> str:
    """The DOM headless Chromium made of ``page`` after its scripts ran (``--dump-dom``)."""
    assert CHROMIUM is not None
    proc = subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "<section" in proc.stdout, proc.stderr[-2000:]
    return proc.stdout
