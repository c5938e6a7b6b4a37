"""A command's options and variables read with the engine's own parser (its manifest).

Every option is resolved the way the engine's parser resolves it (:meth:`Manifest.resolve`:
exact spellings, argparse's unique prefixes, ambiguous ones), its values are taken by its
``nargs`` and checked against its type and choices, and the result is typed (a switch is a
bool, ``--port 8000`` an int). What the parser would refuse is refused here, naming the option
and the closest real ones, before any file is written: an unknown option, an ambiguous prefix,
a value outside the choices.

Spellings the parser accepts but autotune's renderer cannot edit safely are rewritten to the
canonical one, and the output says so: a short alias (``-tp 4`` -> ``--tensor-parallel-size
4``: :mod:`autotune.render` reads options from ``--`` words), a unique prefix (``--max-num-seq``
is what the parser expands it to), vLLM's underscores and ``-O3`` (``FlexibleArgumentParser``
in ``vllm/utils/argparse_utils.py`` rewrites both before parsing).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from autotune.engines import BaseEngine, OptionInfo
from autotune.engines._manifest import split_value
from autotune.errors import ConfigError
from autotune.init.model import ParsedOption, Typed

_NUMBER = re.compile(r"^-\d|^-\.\d")
_VLLM_O = re.compile(r"^-O(\d)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
REFERENCE = re.compile(r"\$\{env:[A-Za-z_][A-Za-z0-9_]*\}")
"""A value the deployment resolves at run time (a credential): never type-checked."""

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _is_value(token: str) -> bool:
    return not token.startswith("-") or bool(_NUMBER.match(token))


def read_options(
    engine: BaseEngine,
    tokens: list[str],
    *,
    origin: str,
    notes: list[str],
) -> tuple[list[ParsedOption], list[str]]:
    """(options, positionals found between options) of ``tokens`` (the words after the
    program and its leading positionals). ``notes`` receives each rewritten spelling."""
    manifest = engine.manifest
    if manifest is None:
        return _generic(tokens), []
    where = f"{engine.name} {engine.version}"
    out: list[ParsedOption] = []
    moved: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "--" or _is_value(token):
            if manifest.parser.kind == "click" and token != "--":
                moved.append(token)  # click takes positionals anywhere; render wants them first
                notes.append(
                    f"{origin}: positional {token!r} moved before the options (same meaning "
                    f"for {where}'s click parser; autotune edits options after the positionals)"
                )
                i += 1
                continue
            raise ConfigError(
                f"{origin}: unexpected argument {token!r} in {where}'s options (a value "
                "without its option, or a positional after the options)",
                field="command",
            )
        spelled = token
        if engine.name == "vllm":
            rewritten = _vllm_spelling(token)
            if rewritten != [token]:
                notes.append(
                    f"{origin}: {token} written {' '.join(rewritten)} (vLLM's "
                    "FlexibleArgumentParser reads it so)"
                )
                tokens = [*tokens[:i], *rewritten, *tokens[i + 1 :]]
                token = tokens[i]
        flag, inline = split_value(token) if token.startswith("--") else (token, None)
        option = _resolve(engine, flag, origin=origin)
        canonical = flag
        if flag not in option.flags or not flag.startswith("--"):
            canonical = next((f for f in option.flags if f.startswith("--")), option.name)
            what = "an abbreviation" if flag.startswith("--") else "a short alias"
            notes.append(
                f"{origin}: {spelled} is {what} of {canonical} in {where}: written in full"
            )
        if inline is not None:
            values = [inline]
            i += 1
        else:
            values = _take(tokens, i, option)
            i += 1 + len(values)
        _check_values(engine, option, canonical, values, inline, origin=origin)
        if option.deprecated:
            hint = f"; use {option.replacement}" if option.replacement else ""
            notes.append(f"{origin}: {canonical} is deprecated in {where}{hint}")
        out.append(
            ParsedOption(
                flag=canonical,
                values=values,
                eq=inline is not None,
                info=option,
                value=typed_value(option, canonical, values),
            )
        )
    return out, moved


def _vllm_spelling(token: str) -> list[str]:
    """``-O3`` -> ``--optimization-level 3``; ``--max_num_seqs`` -> ``--max-num-seqs``."""
    match = _VLLM_O.match(token)
    if match:
        return ["--optimization-level", match.group(1)]
    if token.startswith("--"):
        flag, sep, value = token.partition("=")
        if "_" in flag:
            return [flag.replace("_", "-") + sep + value]
    return [token]


def _resolve(engine: BaseEngine, flag: str, *, origin: str) -> OptionInfo:
    manifest = engine.manifest
    assert manifest is not None
    where = f"{engine.name} {engine.version}"
    found = manifest.resolve(flag)
    if found.status in ("exact", "abbreviation") and found.option is not None:
        return found.option
    if found.status == "ambiguous":
        raise ConfigError(
            f"{origin}: ambiguous option {flag} in {where}: its parser refuses it (it could "
            f"be {', '.join(found.candidates)})",
            field="command",
            closest=list(found.candidates),
        )
    raise ConfigError(
        f"{origin}: unknown option {flag} in {where} (its parser would refuse to start)",
        field="command",
        closest=list(found.candidates) or None,
    )


def _take(tokens: list[str], i: int, option: OptionInfo) -> list[str]:
    """The values argparse gives ``option`` at ``tokens[i]`` (by its nargs)."""
    if not option.takes_value:
        return []
    rest = tokens[i + 1 :]
    if isinstance(option.nargs, int):
        taken = []
        for token in rest[: option.nargs]:
            if not _is_value(token):
                break
            taken.append(token)
        return taken
    if option.nargs in (None, "?"):
        return list(rest[:1]) if rest and _is_value(rest[0]) else []
    out = []
    for token in rest:
        if not _is_value(token):
            break
        out.append(token)
    return out


def _check_values(
    engine: BaseEngine,
    option: OptionInfo,
    flag: str,
    values: list[str],
    inline: str | None,
    *,
    origin: str,
) -> None:
    where = f"{engine.name} {engine.version}"
    if inline is not None and not option.takes_value:
        raise ConfigError(f"{origin}: {flag} takes no value in {where}, got {inline!r}")
    if any(REFERENCE.fullmatch(v) for v in values):
        return  # a credential's reference: its value is only known at run time
    problem = engine.check_values(flag, values)
    if problem is not None:
        raise ConfigError(
            f"{origin}: {problem.message}",
            field="command",
            allowed=list(problem.suggestions) or None,
        )


def typed_value(option: OptionInfo, flag: str, values: list[str]) -> Typed:
    """The value the parser stores for ``flag`` with ``values``."""
    if not option.takes_value:
        if option.action == "store_false":
            return False
        return not (flag.startswith("--no-") and flag != option.flags[0])
    if option.multi_value:
        return list(values)
    if not values:
        return None
    text = values[0]
    if REFERENCE.fullmatch(text):
        return text
    kind = (option.type or "").lower()
    try:
        if kind in ("int", "integer"):
            return int(text)
        if kind == "float":
            return float(text)
    except ValueError:
        return text
    return text


def _generic(tokens: list[str]) -> list[ParsedOption]:
    """No parser known: ``--x v...`` / ``--x=v`` as written, values up to the next ``--``
    (how :mod:`autotune.render` reads them), kept as text."""
    out: list[ParsedOption] = []
    for token in tokens:
        if token.startswith("--") and token != "--":
            flag, inline = split_value(token)
            out.append(
                ParsedOption(
                    flag=flag, values=[] if inline is None else [inline], eq=inline is not None
                )
            )
        elif out:
            out[-1].values.append(token)
        else:  # pragma: no cover - options_start puts the first '--' word first
            raise ConfigError(f"unexpected argument {token!r}", field="command")
    for option in out:
        option.value = option.text if option.values else True
    return out


def read_env(engine: BaseEngine, env: Mapping[str, str], *, origin: str) -> dict[str, Typed]:
    """Each variable typed: the engine's own ones (its prefix) checked against its registry
    (``srt/environ.py``, ``vllm/envs.py``) and typed by its kind; others kept as text."""
    manifest = engine.manifest
    kinds = {e.name: e.kind for e in (manifest.env or ())} if manifest is not None else {}
    out: dict[str, Typed] = {}
    for name, value in env.items():
        if not _ENV_NAME.fullmatch(name):
            raise ConfigError(f"{origin}: {name!r} is not an environment variable name")
        problem = engine.check_env(name)
        if problem is not None:
            raise ConfigError(
                f"{origin}: {problem.message}",
                field=f"env.{name}",
                closest=list(problem.suggestions) or None,
            )
        out[name] = _env_typed(name, value, kinds.get(name), origin=origin, engine=engine)
    return out


def _env_typed(
    name: str, value: str, kind: str | None, *, origin: str, engine: BaseEngine
) -> Typed:
    if kind is None or REFERENCE.fullmatch(value):
        return value
    text = value.strip()
    where = f"{engine.name} {engine.version} declares {name} {kind}"
    if kind.startswith("EnvBool"):
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ConfigError(f"{origin}: {name}={value!r} is not a boolean ({where})")
    try:
        if kind.startswith("EnvInt"):
            return int(text)
        if kind.startswith("EnvFloat"):
            return float(text)
    except ValueError:
        raise ConfigError(f"{origin}: {name}={value!r} is not a number ({where})") from None
    return value
