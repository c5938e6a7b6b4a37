"""Keeping credentials out of everything autotune writes: the study, reports, exports, logs.

A deployment may hand its services a credential (``HF_TOKEN`` in ``env:``, ``--api-key X``
on a command line); the services need the real value, but nothing autotune *stores or shows*
may carry it: the Optuna study (often shared, and readable by optuna-dashboard), the HTML
report, the exports, progress lines, the files autotune writes beside the services.

:func:`redact` is the one function every such path calls. It works on any JSON-like value
(a trial's user attributes, a service record, one message) in two passes:

1. **Collect** the secret values in it (:func:`secret_values`): values of mapping keys that
   look secret (``env`` maps, ``/server_info``'s ``api_key``), the word after a secret-looking
   flag in an argv list (``--api-key X``, ``--api-key=X``), ``NAME=value`` / ``--flag=value``
   / ``"name": "value"`` spelled inside any text (shell lines, ``ServerArgs(api_key='...')``
   in a log), plus the values of secret-looking variables of autotune's own environment
   (a server inherits them and may print them) and the caller's ``extra``.
2. **Replace**: those places become :data:`REDACTED`, and every string anywhere is scrubbed
   of every collected value (also shell-quoted and JSON-escaped spellings, and a fragment of
   one cut by a log tail's edge), of PEM private-key blocks and of URL passwords
   (``postgresql://user:PASSWORD@host``).

Values shorter than :data:`MIN_SECRET_CHARS` and literals such as ``None`` are not scrubbed
from text (they would blank unrelated words) but are still replaced where they are known to
be secret. Names are matched by word (``HF_TOKEN`` yes, ``TOKENIZERS_PARALLELISM``,
``max_total_tokens`` and ``eos_token_id`` no); a name ending in FILE, PATH or DIR names
where a secret lives, not the secret (``key_file``, ``ssl_keyfile``). A secret autotune
cannot recognise by name (``--my-flag hf_x``) is not found: the README says to pass
credentials through secret-looking names.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

__all__ = [
    "MIN_SECRET_CHARS",
    "REDACTED",
    "environ_secrets",
    "is_secret_flag",
    "looks_secret",
    "redact",
    "redact_argv",
    "redact_env",
    "redacted_command",
    "scrub_text",
    "secret_values",
]

T = TypeVar("T")

REDACTED = "<redacted>"
"""What a secret value is replaced with."""
MIN_SECRET_CHARS = 4
"""Shorter values are never scrubbed out of free text (``1`` would blank every digit)."""
_EDGE_CHARS = 6
"""A fragment of a secret at least this long at the start or end of a text is scrubbed
(a log tail cut in the middle of a secret)."""

_STRONG = ("SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "APIKEY")
"""Markers that make a name secret wherever they appear in it (``PGPASSWORD``)."""
_LAST_WORDS = frozenset({"TOKEN", "KEY", "KEYS", "AUTH", "PRIVATE", "PASS", "PAT", "COOKIE"})
"""Markers that make a name secret only as its last word (``HF_TOKEN``, ``API_KEY``): in
LLM serving a "token" is mostly text (``--bucket-inter-token-latency``, ``eos_token_id``)."""
_LOCATION = frozenset({"FILE", "PATH", "DIR", "FILENAME", "KEYFILE", "SOCK"})
"""A last word naming where the secret is kept: ``key_file``, ``HF_TOKEN_PATH``."""
_NOT_SECRET_NAMES = frozenset(
    {
        "TIME_TO_FIRST_TOKEN",
        "BUCKET_TIME_TO_FIRST_TOKEN",
        "ALLOW_CREDENTIALS",
        "NO_ALLOW_CREDENTIALS",
    }
)
"""Names that look like a secret but are not: SGLang's latency histogram buckets, vLLM's CORS
switch (``--allow-credentials``)."""
_NOT_SECRETS = frozenset({"none", "null", "nil", "true", "false", "undefined", "redacted", "***"})

_SPLIT = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_QUOTED = r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\""
_ASSIGN = re.compile(rf"(?<![\w-])([A-Za-z_][A-Za-z0-9_]*)=({_QUOTED}|[^\s,;)'\"\]}}]+)")
_FLAG_EQ = re.compile(rf"(?<![\w-])(--?[A-Za-z][A-Za-z0-9_-]*)=({_QUOTED}|[^\s,;)'\"]+)")
_FLAG_SP = re.compile(rf"(?<![\w-])(--?[A-Za-z][A-Za-z0-9_-]*)\s+({_QUOTED}|[^\s'\"]+)")
_DICT = re.compile(rf"([\"'])([A-Za-z_][A-Za-z0-9_-]*)\1\s*:\s*({_QUOTED})")
_PEM = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)",
    re.DOTALL,
)
_PEM_TAIL = re.compile(r"\A.*?-----END [A-Z0-9 ]*PRIVATE KEY-----", re.DOTALL)
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)([^\s@/]+)(@)")


def looks_secret(name: str) -> bool:
    """True when a variable, flag or field name suggests a credential.

    ``HF_TOKEN``, ``OPENAI_API_KEY``, ``aws_secret_access_key``, ``PGPASSWORD``,
    ``--admin-api-key``, ``apiKey`` are secret; ``TOKENIZERS_PARALLELISM``,
    ``max_total_tokens``, ``key_file``, ``NCCL_PROTO`` are not.
    """
    words = [w.upper() for w in _SPLIT.findall(name)]
    if not words or words[-1] in _LOCATION or "_".join(words) in _NOT_SECRET_NAMES:
        return False
    if words[-2:] == ["PER", "TOKEN"]:  # a rate (--kt-max-deferred-experts-per-token)
        return False
    upper = name.upper()
    return any(m in upper for m in _STRONG) or words[-1] in _LAST_WORDS


def is_secret_flag(word: str) -> bool:
    """``--api-key``, ``--hf-token``, ``--password``: a flag whose value is a secret."""
    return word.startswith("-") and "=" not in word and looks_secret(word.lstrip("-"))


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the values of secret-looking variables replaced by :data:`REDACTED`."""
    return {k: (REDACTED if looks_secret(k) and v else v) for k, v in env.items()}


def redact_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with the word after a secret flag (``--api-key X``) and the value of
    ``--api-key=X`` replaced by :data:`REDACTED`."""
    out: list[str] = []
    secret_next = False
    for word in argv:
        if secret_next and not word.startswith("--"):
            out.append(REDACTED)
            secret_next = False
            continue
        secret_next = is_secret_flag(word)
        flag, eq, value = word.partition("=")
        if eq and value and is_secret_flag(flag):
            out.append(f"{flag}={REDACTED}")
        else:
            out.append(word)
    return out


def redacted_command(
    argv: Sequence[str], env: Mapping[str, str], unset_env: Iterable[str] = ()
) -> str:
    """The paste-able ``env -u X A=1 prog ...`` line of a service (the spelling of
    :meth:`autotune.specs.ServiceSpec.command_line`) with its secrets redacted."""
    record = {"argv": list(argv), "env": dict(env), "unset_env": sorted(unset_env)}
    return str(_command_line(redact(record, environ={})))


def environ_secrets(environ: Mapping[str, str] | None = None) -> set[str]:
    """Values of secret-looking variables of autotune's own environment (inherited by the
    services it starts locally, so they may turn up in their logs)."""
    env = os.environ if environ is None else environ
    return {v for k, v in env.items() if looks_secret(k) and _scrubbable(v)}


def secret_values(
    obj: object, *, extra: Iterable[str] = (), environ: Mapping[str, str] | None = None
) -> set[str]:
    """Every secret value found in ``obj`` (see the module docstring), with ``extra`` and the
    secrets of ``environ`` (default: ``os.environ``; pass ``{}`` for none)."""
    found: set[str] = set()
    _collect(obj, found)
    found.update(v for v in extra if isinstance(v, str))
    found |= environ_secrets(environ)
    return {v for v in found if _scrubbable(v)}


def redact(obj: T, *, extra: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> T:
    """A deep copy of JSON-like ``obj`` with every secret replaced by :data:`REDACTED`.

    ``obj`` may be a trial's user attributes, one service record, a list or a single
    message. ``extra``: values known to be secret that ``obj`` may not reveal by name (e.g.
    the rendered services' values when redacting a message about them). ``environ``: see
    :func:`secret_values`. Tuples stay tuples; non-string scalars are kept as they are.
    """
    values = secret_values(obj, extra=extra, environ=environ)
    return _replace(obj, _Scrubber(values))  # type: ignore[no-any-return]


def scrub_text(
    text: str, *, extra: Iterable[str] = (), environ: Mapping[str, str] | None = None
) -> str:
    """:func:`redact` for one string (a progress line, an error message)."""
    return redact(text, extra=extra, environ=environ)


# --------------------------------------------------------------------- collecting
def _scrubbable(value: str) -> bool:
    v = value.strip()
    return len(v) >= MIN_SECRET_CHARS and v.lower() not in _NOT_SECRETS and REDACTED not in v


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def _collect(obj: object, found: set[str]) -> None:
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            if isinstance(key, str) and looks_secret(key):
                found.update(_strings(value))
            _collect(value, found)
    elif isinstance(obj, (list, tuple)):
        words = [w for w in obj if isinstance(w, str)]
        if len(words) == len(obj):
            for i, word in enumerate(words):
                flag, eq, value = word.partition("=")
                if eq and is_secret_flag(flag):
                    found.add(value)
                elif (
                    is_secret_flag(word)
                    and i + 1 < len(words)
                    and not words[i + 1].startswith("--")
                ):
                    found.add(words[i + 1])
        for item in obj:
            _collect(item, found)
    elif isinstance(obj, str):
        _collect_text(obj, found)


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _collect_text(text: str, found: set[str]) -> None:
    """Secrets spelled inside free text: ``NAME=v``, ``--flag=v``, ``--flag v``, ``"name": "v"``."""
    if "=" in text:
        for m in _ASSIGN.finditer(text):
            if looks_secret(m.group(1)):
                found.add(_unquote(m.group(2)))
        for m in _FLAG_EQ.finditer(text):
            if is_secret_flag(m.group(1)):
                found.add(_unquote(m.group(2)))
    if "-" in text:
        for m in _FLAG_SP.finditer(text):
            value = _unquote(m.group(2))
            # "--api-key must be set" in prose is not a key: demand something token-like.
            if is_secret_flag(m.group(1)) and not value.startswith("-") and _token_like(value):
                found.add(value)
    if ":" in text:
        for m in _DICT.finditer(text):
            if looks_secret(m.group(2)):
                found.add(_unquote(m.group(3)))
    if "@" in text:
        for m in _URL_PASSWORD.finditer(text):
            found.add(m.group(2))


def _token_like(value: str) -> bool:
    return len(value) >= 8 and not value.isalpha()


# --------------------------------------------------------------------- replacing
class _Scrubber:
    """Replaces known secret values (and their quoted spellings) inside strings."""

    def __init__(self, values: Iterable[str]) -> None:
        pairs: dict[str, str] = {}
        for value in values:
            pairs[value] = REDACTED
            quoted = shlex.quote(value)
            if quoted != value:
                pairs[quoted] = shlex.quote(REDACTED)
            escaped = json.dumps(value)[1:-1]
            if escaped != value:
                pairs[escaped] = REDACTED
        # Longest first: a secret that contains another is replaced whole.
        self.pairs = sorted(pairs.items(), key=lambda kv: len(kv[0]), reverse=True)
        self.values = sorted(values, key=len, reverse=True)

    def text(self, text: str) -> str:
        if not text:
            return text
        for old, new in self.pairs:
            if old in text:
                text = text.replace(old, new)
        text = self._edges(text)
        if "PRIVATE KEY-----" in text:
            text = _PEM.sub(REDACTED, text)
            text = _PEM_TAIL.sub(REDACTED, text)
        if "@" in text:
            text = _URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)
        return text

    def _edges(self, text: str) -> str:
        """A secret cut by the start or end of ``text`` (a truncated log tail)."""
        for value in self.values:
            for n in range(min(len(value), len(text)) - 1, _EDGE_CHARS - 1, -1):
                if text.startswith(value[-n:]):
                    text = REDACTED + text[n:]
                    break
            for n in range(min(len(value), len(text)) - 1, _EDGE_CHARS - 1, -1):
                if text.endswith(value[:n]):
                    text = text[: len(text) - n] + REDACTED
                    break
        return text


def _replace(obj: Any, scrub: _Scrubber) -> Any:
    if isinstance(obj, str):
        return scrub.text(obj)
    if isinstance(obj, Mapping):
        out: dict[Any, Any] = {}
        for key, value in obj.items():
            new_key = scrub.text(key) if isinstance(key, str) else key
            if isinstance(key, str) and looks_secret(key) and _has_text(value):
                out[new_key] = _blank(value)
            else:
                out[new_key] = _replace(value, scrub)
        if _changed_record(obj, out):
            # A service record whose argv or env held a secret: the stored command is rebuilt
            # from the redacted parts, so no quoting of the value can slip past the scrub.
            out["command"] = _command_line(out)
        return out
    if isinstance(obj, (list, tuple)):
        words = obj
        if all(isinstance(w, str) for w in obj):
            words = redact_argv(obj)
        items = [_replace(item, scrub) for item in words]
        return tuple(items) if isinstance(obj, tuple) else items
    return obj


def _changed_record(old: Mapping[Any, Any], new: dict[Any, Any]) -> bool:
    if not (isinstance(new.get("argv"), list) and isinstance(new.get("command"), str)):
        return False
    return new["argv"] != list(old.get("argv") or []) or new.get("env") != old.get("env")


def _has_text(value: object) -> bool:
    return any(s for s in _strings(value))


def _blank(value: Any) -> Any:
    if isinstance(value, str):
        return REDACTED if value else value
    if isinstance(value, (list, tuple)):
        items = [_blank(v) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    return value


def _command_line(rec: Mapping[str, Any]) -> str:
    """Like :meth:`autotune.specs.ServiceSpec.command_line`, from a (redacted) record."""
    raw_env, raw_unset = rec.get("env"), rec.get("unset_env")
    env: Mapping[str, Any] = raw_env if isinstance(raw_env, Mapping) else {}
    unset: list[Any] = raw_unset if isinstance(raw_unset, list) else []
    parts: list[str] = []
    if env or unset:
        parts.append("env")
        for name in sorted(str(u) for u in unset):
            parts += ["-u", name]
        parts += [f"{k}={v}" for k, v in sorted(env.items())]
    parts += [str(a) for a in rec["argv"]]
    return shlex.join(parts)
