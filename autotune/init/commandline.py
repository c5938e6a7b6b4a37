"""A command line as a person types it: its environment, its wrapper, its program.

``HF_TOKEN=x CUDA_VISIBLE_DEVICES=0 numactl --cpunodebind=0 python -m vllm.entrypoints...``
is three things autotune keeps apart: variables (the deployment's ``env:``), a wrapper it
never edits (``wrapper:``), and the engine's own command, whose options the space may tune
(:mod:`autotune.render` edits tokens from the first ``--flag`` after the program on). The
``env A=1 prog`` spelling (what :meth:`autotune.specs.ServiceSpec.command_line` prints) is read
the same way.

Where the program starts is told by the engine's marker (``sglang.launch_server`` after
``-m``, ``vllm serve``): the interpreter before ``-m`` belongs to the program, everything
before it to the wrapper. For a program no engine knows, only the wrappers named in
:data:`WRAPPERS` are recognised, with the options their manuals document.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from autotune.errors import ConfigError

_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
_PYTHON = re.compile(r"^python[0-9.]*$")

WRAPPERS: dict[str, frozenset[str]] = {
    # numactl(8): the short options that take a separate value.
    "numactl": frozenset({"-C", "-N", "-m", "-p", "-i", "-P", "-w", "-b"}),
    # taskset(1): -c takes a CPU list; without -c the first word is a mask.
    "taskset": frozenset({"-c"}),
    "nice": frozenset({"-n"}),
    "ionice": frozenset({"-c", "-n", "-p"}),
    "chrt": frozenset(),
    "stdbuf": frozenset({"-i", "-o", "-e"}),
}
"""Programs that run another program, and which of their short options take a value."""


@dataclass
class CommandText:
    """A command line split into its parts (nothing interpreted yet)."""

    env: dict[str, str] = field(default_factory=dict)
    unset: list[str] = field(default_factory=list)
    argv: list[str] = field(default_factory=list)


def split_command(text: str, *, field_name: str = "--from-command") -> CommandText:
    """``A=1 env -u X B=2 prog args`` -> env {A, B}, unset [X], argv [prog, args].

    Shell syntax beyond words and quotes (pipes, ``&&``, ``$(...)``, redirections) is refused:
    a deployment runs one program, not a shell script."""
    try:
        words = shlex.split(text, comments=False, posix=True)
    except ValueError as exc:
        raise ConfigError(f"cannot split {text!r} into words: {exc}", field=field_name) from None
    for word in words:
        if word in ("|", "||", "&&", ";", "&", ">", "<", ">>", "2>", "2>&1"):
            raise ConfigError(
                f"{text!r} is a shell pipeline or list ({word!r}): give the one command that "
                "runs the server (a wrapper script is a program too)",
                field=field_name,
            )
    out = CommandText()
    i = 0
    while i < len(words):
        match = _ASSIGNMENT.match(words[i])
        if match:
            out.env[match.group(1)] = match.group(2)
            i += 1
            continue
        if PurePosixPath(words[i]).name == "env":
            i = _env_program(words, i + 1, out, field_name=field_name)
            continue
        break
    out.argv = words[i:]
    if not out.argv:
        raise ConfigError(f"{text!r} names no program to run", field=field_name)
    return out


def _env_program(words: list[str], i: int, out: CommandText, *, field_name: str) -> int:
    """``env [-u NAME]... [NAME=VALUE]...``: env(1)'s options that keep the environment."""
    while i < len(words):
        word = words[i]
        if word in ("-u", "--unset") and i + 1 < len(words):
            out.unset.append(words[i + 1])
            i += 2
        elif word.startswith("--unset="):
            out.unset.append(word.split("=", 1)[1])
            i += 1
        elif word.startswith("-u") and len(word) > 2:
            out.unset.append(word[2:])
            i += 1
        elif word in ("-i", "--ignore-environment", "-"):
            raise ConfigError(
                "`env -i` starts the program with an empty environment, which a deployment "
                "cannot express (its services inherit autotune's): list the variables instead",
                field=field_name,
            )
        elif word.startswith("-"):
            raise ConfigError(f"env option {word!r} is not supported here", field=field_name)
        else:
            match = _ASSIGNMENT.match(word)
            if match is None:
                return i
            out.env[match.group(1)] = match.group(2)
            i += 1
    return i


def program_start(argv: list[str], marker_end: int, marker_words: int) -> int:
    """Index of the program's first word, given where the engine's marker ends: the
    interpreter when the marker is a module run with ``-m`` (``python -u -m sglang...``)."""
    start = marker_end - marker_words
    if start >= 1 and argv[start - 1] == "-m":
        j = start - 2
        while j >= 0 and argv[j].startswith("-"):  # interpreter options: python -u -X dev -m
            j -= 1
        if j >= 0 and _PYTHON.match(PurePosixPath(argv[j]).name):
            return j
        return start - 1
    return start


def generic_program_start(argv: list[str]) -> int:
    """Where the program starts when no engine marks it: after the wrappers of
    :data:`WRAPPERS` and their options."""
    i = 0
    while i < len(argv):
        name = PurePosixPath(argv[i]).name
        takes_value = WRAPPERS.get(name)
        if takes_value is None:
            return i
        i += 1
        while i < len(argv) and argv[i].startswith("-"):
            i += 2 if argv[i] in takes_value else 1
        if name == "taskset" and "-c" not in argv[:i] and i < len(argv):
            i += 1  # taskset MASK program
        if name in ("nice", "ionice", "chrt") and i < len(argv) and argv[i].isdigit():
            i += 1  # chrt PRIORITY program
    return i


def options_start(argv: list[str], after: int) -> int:
    """The first ``-``-prefixed word at or after ``after`` (where the options begin)."""
    for i in range(after, len(argv)):
        if argv[i].startswith("-") and argv[i] != "-":
            return i
    return len(argv)
