"""Values in systemd unit files: quoting and what a unit file cannot carry.

Two writers share these rules: the systemd export (:mod:`autotune.export.systemd`, units
for good) and the drop-in the systemd service manager writes while it tunes
(:mod:`autotune.remote.dropin`). They sit here, below both, so that running a unit does not
load the export (and through it the stored-results model and Optuna).

Quoting follows systemd.exec(5), systemd.service(5) and systemd.syntax(7):

* ``Environment="NAME=value"``: one quoted assignment per line; inside double quotes C escapes
  apply (``\\\\`` and ``\\"``), specifiers are expanded everywhere (``%`` -> ``%%``), and ``$``
  has no meaning there.
* ``ExecStart=``: words are split on whitespace and unquoted like ``Environment=``, specifiers
  apply (``%%``) and ``$VAR`` / ``${VAR}`` are substituted at start, so a literal ``$`` is
  written ``$$``. A lone ``;`` would separate commands; quoting it (``";"``) keeps it literal.
* A newline or other control character cannot be carried by a unit file setting at all: it is
  refused with a :class:`~autotune.errors.ConfigError` rather than silently changed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from autotune.errors import ConfigError

DROPIN_NAME = "50-autotune.conf"
"""The drop-in file autotune writes into ``UNIT.d/`` (tuning, and the export's drop-ins)."""

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SAFE_WORD = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")
"""An ``ExecStart=`` word that needs no quoting."""
CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
"""Characters a unit file setting cannot carry (a tab is escaped, the rest not)."""


def environment_line(name: str, value: str, *, service: str = "") -> str:
    """``Environment="NAME=value"`` with systemd escaping; refuses what cannot be written."""
    check_env_name(name, service=service)
    check_text(value, what=f"environment variable {name}", service=service)
    return f'Environment="{escape(f"{name}={value}", dollar=False)}"'


def exec_line(argv: list[str], *, service: str = "", key: str = "ExecStart") -> str:
    """``ExecStart=/abs/prog arg ...``; argv[0] must already be absolute."""
    for arg in argv:
        check_text(arg, what="command-line argument", service=service)
    return f"{key}=" + " ".join(exec_word(arg) for arg in argv)


def check_env_name(name: str, *, service: str) -> None:
    """Refuse a variable name a unit's ``Environment=`` cannot set."""
    if not ENV_NAME.fullmatch(name):
        raise ConfigError(
            f"service '{service}': '{name}' is not a valid environment variable name",
            field=f"services.{service}.env",
        )


def check_text(value: str, *, what: str, service: str) -> None:
    """Refuse a value with a newline or another control character."""
    if "\n" in value or "\r" in value:
        raise ConfigError(
            f"service '{service}': {what} {value!r} contains a newline, which a systemd unit "
            "file cannot carry; use an EnvironmentFile= or a wrapper script instead",
            field=f"services.{service}",
        )
    if CONTROL.search(value):
        raise ConfigError(
            f"service '{service}': {what} {value!r} contains a control character, which a "
            "systemd unit file cannot carry",
            field=f"services.{service}",
        )


def escape(text: str, *, dollar: bool) -> str:
    """Backslashes, quotes, ``%`` and tabs escaped; ``$`` doubled where it would substitute."""
    out = text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("\t", "\\t")
    return out.replace("$", "$$") if dollar else out


def exec_word(word: str) -> str:
    """One ``ExecStart=`` word: as it is when safe, else double-quoted and escaped."""
    if SAFE_WORD.fullmatch(word):
        return word
    return f'"{escape(word, dollar=True)}"'


def scratch_lines(variables: Sequence[str], directory: str, *, service: str) -> list[str]:
    """A service's scratch variables (``ServiceSpec.scratch_env``: where the engine leaves
    files it never removes) in a unit or drop-in: systemd makes ``RuntimeDirectory=`` (under
    ``/run``, ``%t``; owned by the unit's ``User=``) before each start and removes it at each
    stop, which is what the local and process managers do by hand."""
    if not variables:
        return []
    for var in variables:
        check_env_name(var, service=service)
    return [
        f"RuntimeDirectory={directory}",
        "RuntimeDirectoryMode=0700",
        *(f'Environment="{var}=%t/{directory}"' for var in sorted(set(variables))),
    ]
