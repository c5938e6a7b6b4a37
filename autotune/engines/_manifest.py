"""An engine's options as its own parser declares them (a generated, committed manifest).

Manifests are written by ``scripts/engines/manifest.py generate ENGINE VERSION`` from the
real parser of a pinned release (never by hand) and read here. :meth:`Manifest.resolve`
applies the parser's own matching rules, prefix matching included: argparse accepts a unique
prefix (``--tp`` for ``--tp-size``) and rejects one that fits several options, so a flag that
a release removed can turn *ambiguous* (``--cuda-graph-max-bs`` in SGLang 0.5.20+).
"""

from __future__ import annotations

import difflib
import functools
import json
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from autotune.errors import ConfigError

MANIFEST_PACKAGE = "autotune.engines.manifests"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class OptionInfo(_Frozen):
    """One option of the parser: every spelling of it, what it takes, what it allows."""

    flags: tuple[str, ...]
    dest: str
    action: str
    """argparse's action (store, store_true, boolean_optional, ...) or the engine's own class."""
    takes_value: bool
    nargs: int | str | None = None
    type: str | None = None
    choices: tuple[str | int | float | None, ...] | None = None
    default: Any = None
    required: bool = False
    deprecated: bool = False
    replacement: str | None = None
    """What a deprecated option's warning tells the user to write instead."""
    error: str | None = None
    help: str = ""

    @property
    def name(self) -> str:
        """The canonical (first) spelling."""
        return self.flags[0]

    def allows(self, value: str) -> bool:
        """Whether ``value`` (as typed on the command line) is one of the choices, converted
        by the option's type first, as argparse does."""
        if self.choices is None:
            return True
        converted: object = value
        try:
            if self.type == "int":
                converted = int(value)
            elif self.type == "float":
                converted = float(value)
        except ValueError:
            return False
        return converted in self.choices or value in {str(c) for c in self.choices}

    @property
    def multi_value(self) -> bool:
        return self.nargs in ("+", "*") or (isinstance(self.nargs, int) and self.nargs > 1)


class EnvInfo(_Frozen):
    name: str
    kind: str
    default: Any = None


class ParserInfo(_Frozen):
    kind: Literal["argparse", "click"]
    allow_abbrev: bool


class Resolution(_Frozen):
    """How the parser reads one flag spelling."""

    flag: str
    status: Literal["exact", "abbreviation", "ambiguous", "unknown"]
    option: OptionInfo | None = None
    """The option it selects (exact or a unique abbreviation)."""
    candidates: tuple[str, ...] = ()
    """The spellings it could mean (abbreviation/ambiguous) or the closest ones (unknown)."""


class Manifest(_Frozen):
    """All options (and, where the engine keeps a registry, environment variables)."""

    engine: str
    version: str
    package: str
    program: str
    parser: ParserInfo
    import_stubs: tuple[str, ...] = ()
    options: tuple[OptionInfo, ...]
    env: tuple[EnvInfo, ...] | None = None
    generated_by: str = ""

    @functools.cached_property
    def _by_flag(self) -> dict[str, OptionInfo]:
        return {flag: option for option in self.options for flag in option.flags}

    @functools.cached_property
    def _by_dest(self) -> dict[str, OptionInfo]:
        out: dict[str, OptionInfo] = {}
        for option in self.options:
            out.setdefault(option.dest, option)
        return out

    @functools.cached_property
    def env_names(self) -> frozenset[str] | None:
        return None if self.env is None else frozenset(e.name for e in self.env)

    @property
    def flags(self) -> tuple[str, ...]:
        return tuple(self._by_flag)

    def option(self, flag: str) -> OptionInfo | None:
        """The option spelled exactly ``flag`` (no prefix matching)."""
        return self._by_flag.get(flag)

    def option_for_dest(self, dest: str) -> OptionInfo | None:
        """The option that stores into ``dest`` (a resolved field of ``/server_info``)."""
        return self._by_dest.get(dest)

    def resolve(self, flag: str) -> Resolution:
        """Read ``flag`` (without ``=value``) the way the engine's parser does."""
        exact = self._by_flag.get(flag)
        if exact is not None:
            return Resolution(flag=flag, status="exact", option=exact)
        longer = tuple(sorted(f for f in self._by_flag if f.startswith(flag)))
        if longer and self.parser.allow_abbrev:
            targets = {self._by_flag[f].dest for f in longer}
            if len(longer) == 1 or len(targets) == 1:
                return Resolution(
                    flag=flag,
                    status="abbreviation",
                    option=self._by_flag[longer[0]],
                    candidates=longer,
                )
            return Resolution(flag=flag, status="ambiguous", candidates=longer)
        return Resolution(flag=flag, status="unknown", candidates=self.closest(flag))

    def closest(self, flag: str, *, n: int = 5) -> tuple[str, ...]:
        """The real spellings nearest to ``flag`` (prefix completions first)."""
        longer = sorted(f for f in self._by_flag if f.startswith(flag))
        close = difflib.get_close_matches(flag, list(self._by_flag), n=n, cutoff=0.6)
        out: list[str] = []
        for f in [*longer, *close]:
            if f not in out:
                out.append(f)
        return tuple(out[:n])

    def closest_env(self, name: str, *, n: int = 5) -> tuple[str, ...]:
        if self.env is None:
            return ()
        return tuple(difflib.get_close_matches(name, sorted(self.env_names or ()), n=n, cutoff=0.6))


def available_manifests() -> dict[str, tuple[str, ...]]:
    """Engine name -> versions with a committed manifest."""
    found: dict[str, list[str]] = {}
    for entry in resources.files(MANIFEST_PACKAGE).iterdir():
        name = entry.name
        if not name.endswith(".json"):
            continue
        engine, _, version = name[: -len(".json")].rpartition("-")
        found.setdefault(engine, []).append(version)
    return {e: tuple(sorted(v, key=_version_key)) for e, v in sorted(found.items())}


def _version_key(version: str) -> tuple[object, ...]:
    return tuple(int(p) if p.isdigit() else p for p in version.replace("-", ".").split("."))


@functools.cache
def load_manifest(engine: str, version: str) -> Manifest:
    """The committed manifest of ``engine`` at ``version``; a :class:`ConfigError` naming the
    versions that exist when there is none."""
    entry = resources.files(MANIFEST_PACKAGE).joinpath(f"{engine}-{version}.json")
    if not entry.is_file():
        versions = available_manifests().get(engine, ())
        raise ConfigError(
            f"no manifest for {engine} {version} (generate one with "
            f"`python scripts/engines/manifest.py generate {engine} {version}`)",
            field="engine.version",
            allowed=versions or None,
        )
    data = json.loads(entry.read_text())
    return Manifest.model_validate(data)


def split_value(token: str) -> tuple[str, str | None]:
    """``--flag=value`` -> (``--flag``, ``value``); ``--flag`` -> (``--flag``, None)."""
    flag, sep, value = token.partition("=")
    return (flag, value) if sep else (token, None)
