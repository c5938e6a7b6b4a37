"""Deployment templates: ``${name}`` in a deployment file's strings, expanded from the values
the caller knows (a service's host and ports, the run directory, ...) and ``${env:VAR}`` from
the environment autotune runs in; ``$${`` is a literal ``${``.

A module of its own: :mod:`autotune.deployment` checks a file's templates when it is loaded
and :mod:`autotune.render` expands them for a trial; neither is about templates.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping

from autotune.errors import ConfigError

TEMPLATE_RX = re.compile(r"\$(\$?)\{([^}]*)\}")
"""``${name}``, or ``$${...}`` (group 1 set): the literal text ``${...}``."""

ENV_TEMPLATE = "env:"
"""``${env:VAR}``: a variable of the environment autotune runs in (a credential kept out of
the file)."""


class AnyEnviron(Mapping[str, str]):
    """Every variable "set" (to ""): checking a file's templates needs no credential."""

    def __getitem__(self, key: str) -> str:
        return ""

    def __contains__(self, key: object) -> bool:
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def expand(
    text: str,
    values: Mapping[str, str],
    *,
    file: str,
    field: str,
    environ: Mapping[str, str] | None = None,
) -> str:
    """Replace ``${name}``; unknown names raise ConfigError naming file, field and allowed.
    ``${env:VAR}`` reads ``environ`` (default: autotune's own environment)."""

    def sub(match: re.Match[str]) -> str:
        if match.group(1):
            return "${" + match.group(2) + "}"
        name = match.group(2).strip()
        if name.startswith(ENV_TEMPLATE) and name not in values:
            return _from_environ(name[len(ENV_TEMPLATE) :], environ, file=file, field=field)
        if name not in values:
            raise ConfigError(
                f"unknown template '${{{match.group(2)}}}' in {text!r}",
                file=file,
                field=field,
                allowed=[f"${{{n}}}" for n in sorted(values)],
            )
        return values[name]

    return TEMPLATE_RX.sub(sub, text)


def _from_environ(var: str, environ: Mapping[str, str] | None, *, file: str, field: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", var):
        raise ConfigError(
            f"'${{env:{var}}}': {var!r} is not an environment variable name", file=file, field=field
        )
    env = os.environ if environ is None else environ
    if var not in env:
        raise ConfigError(
            f"'${{env:{var}}}' is read from the environment autotune runs in, and {var} is not "
            f"set there: export {var} first",
            file=file,
            field=field,
        )
    return env[var]
