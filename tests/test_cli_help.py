"""Help screens wrap to the terminal, not where the source wrapped its docstrings.

Each help is rendered in-process (typer's CliRunner) at a terminal wider than any paragraph:
then every paragraph of every docstring, and every option's help, must come out on one line.
A hard line break left in the middle of a sentence would split it over two.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from autotune.cli import app
from autotune.cli._common import help_text

WIDE = 1000
"""Columns: wider than any paragraph, so a paragraph on two lines is a hard break."""


def _commands(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """The app and every command below it (a group has ``commands``), each with the arguments
    that reach it."""
    found = [(path, command)]
    for name, sub in getattr(command, "commands", {}).items():
        found += _commands(sub, (*path, name))
    return found


COMMANDS = _commands(typer.main.get_command(app))


def _render(args: tuple[str, ...], columns: int) -> list[str]:
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def _paragraphs(text: str | None) -> list[str]:
    """What must be on one line each: every paragraph of a docstring or option help, however
    the source wrapped it; each line of a paragraph marked to keep its lines (Click's ``\\b``)."""
    out: list[str] = []
    for paragraph in inspect.cleandoc(text or "").split("\n\n"):
        if paragraph.startswith("\b"):
            out += [line.strip() for line in paragraph[1:].splitlines() if line.strip()]
        elif paragraph.strip():
            out.append(" ".join(paragraph.split()))
    return out


def _on_one_line(needle: str, lines: list[str]) -> bool:
    return any(needle in line for line in lines)


def test_every_command_is_covered() -> None:
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"run", "best", "status", "migrate", "space check", "space render", "bench"} <= names


@pytest.mark.parametrize(
    ("args", "command"), COMMANDS, ids=[" ".join(p) or "autotune" for p, _ in COMMANDS]
)
def test_help_paragraphs_are_never_broken(args: tuple[str, ...], command: Any) -> None:
    lines = _render(args, WIDE)
    expected = _paragraphs(command.help)
    assert expected, f"{args}: no help text"
    for paragraph in expected:
        assert _on_one_line(paragraph, lines), f"{args}: broken paragraph {paragraph!r}"
    for param in command.params:
        for paragraph in _paragraphs(getattr(param, "help", None)):
            assert _on_one_line(paragraph, lines), f"{args} {param.name}: broken {paragraph!r}"
    # A group's list of commands shows each one's first paragraph.
    for name, sub in getattr(command, "commands", {}).items():
        summary = _paragraphs(sub.help)[0]
        assert _on_one_line(summary, lines), f"{args} lists {name} broken: {summary!r}"


@pytest.mark.parametrize("args", [(), ("best",)])
def test_best_summary_on_one_line_at_200_columns(args: tuple[str, ...]) -> None:
    """The sentence that used to break after "mean +-" in both help screens."""
    lines = _render(args, 200)
    assert _on_one_line("its metrics, mean +- 95% CI over its measurements", lines), lines


def test_help_text_keeps_marked_paragraphs() -> None:
    doc = """Summary wrapped
    in the source.

    \b
    keep: one
    keep: two

    Another
    paragraph."""
    assert help_text(doc) == (
        "Summary wrapped in the source.\n\n\b\nkeep: one\nkeep: two\n\nAnother paragraph."
    )


def test_marked_paragraph_keeps_its_lines_on_screen() -> None:
    """Click's ``\\b`` marker, through typer's rich help: a list keeps its line breaks."""
    demo = typer.Typer()

    def example() -> None:
        """Do the thing
        well.

        \b
        first: a
        second: b
        """

    demo.command(help=help_text(example.__doc__))(example)
    demo.command("other")(example)  # two commands: the help shows a list of them
    result = CliRunner().invoke(demo, ["example", "--help"], env={"COLUMNS": "200"})
    lines = [line.strip() for line in result.output.splitlines()]
    assert "Do the thing well." in lines
    assert "first: a" in lines and "second: b" in lines
