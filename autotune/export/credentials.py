"""Where the exports put a service's credentials: never in the export text itself.

The study stores a secret as ``<redacted>`` (:mod:`autotune.secrets`), and even an older
study that holds a real value must not have it copied into a unit or printed. So every
exporter first splits a service into its public settings and its **secret slots**, each
carried by a variable:

* a secret variable (``HF_TOKEN``) is its own slot;
* a secret flag's value (``--api-key X``, ``--api-key=X``) gets the variable
  ``AUTOTUNE_SECRET_API_KEY`` (``_2``, ``_3`` for repeats), referenced from the command.

The text formats reference the variable (``"${HF_TOKEN:?...}"``: the shell fails loudly when
it is unset, instead of starting a server with a blank credential). The systemd export
writes the values into an owner-only ``EnvironmentFile=``: taken from the deployment as it
is now (``current``: the rendered services) or autotune's own environment (``HF_TOKEN``
exported in the shell), else :data:`PLACEHOLDER`, which the install script refuses.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from autotune.results import ServiceRecord, TrialResult
from autotune.secrets import REDACTED, is_secret_flag, looks_secret, redact

PLACEHOLDER = "__FILL_IN__"
"""Value written for a secret whose value autotune does not know."""
FLAG_PREFIX = "AUTOTUNE_SECRET_"


class ServiceLike(Protocol):
    """What :func:`split_service` reads from the current deployment (a ``ServiceSpec``)."""

    @property
    def argv(self) -> Sequence[str]: ...

    @property
    def env(self) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class Ref:
    """An argv word that is (or contains) a secret: ``prefix`` + the variable's value."""

    var: str
    prefix: str = ""


@dataclass(frozen=True)
class Slot:
    """One secret of a service: the variable carrying it and where it came from."""

    var: str
    flag: str | None = None
    """The flag whose value it is (``--api-key``), None for a variable."""
    occurrence: int = 1
    """Which occurrence of ``flag`` in the argv (1 = first)."""

    @property
    def what(self) -> str:
        return f"value of {self.flag}" if self.flag else "environment variable"


@dataclass(frozen=True)
class SplitService:
    """A service with its secrets moved out of the argv and environment."""

    argv: list[str | Ref]
    env: dict[str, str]
    """Public variables only."""
    slots: list[Slot] = field(default_factory=list)


def redact_trial(trial: TrialResult) -> TrialResult:
    """``trial`` with every secret redacted: what each exporter starts from, so a study
    written before redaction existed (or by other tooling) exports no credential either."""
    return TrialResult.model_validate(redact(trial.model_dump()))


def split_service(rec: ServiceRecord) -> SplitService:
    """Public settings and secret slots of a stored service (redacted or not)."""
    slots: list[Slot] = []
    env: dict[str, str] = {}
    for name, value in rec.env.items():
        if looks_secret(name) and value:
            slots.append(Slot(var=name))
        else:
            env[name] = value
    taken = set(rec.env) | set(rec.unset_env)
    seen: dict[str, int] = {}
    argv: list[str | Ref] = []
    secret_next: str | None = None
    for word in rec.argv:
        flag, eq, _ = word.partition("=")
        if secret_next is not None and not word.startswith("--"):
            argv.append(Ref(_flag_slot(secret_next, seen, taken, slots)))
            secret_next = None
            continue
        secret_next = None
        if eq and is_secret_flag(flag):
            argv.append(Ref(_flag_slot(flag, seen, taken, slots), prefix=f"{flag}="))
            continue
        if is_secret_flag(word):
            secret_next = word
        argv.append(word)
    return SplitService(argv=argv, env=env, slots=slots)


def _flag_slot(flag: str, seen: dict[str, int], taken: set[str], slots: list[Slot]) -> str:
    seen[flag] = seen.get(flag, 0) + 1
    base = FLAG_PREFIX + re.sub(r"[^A-Za-z0-9]+", "_", flag.lstrip("-")).upper().strip("_")
    var = base if seen[flag] == 1 else f"{base}_{seen[flag]}"
    while var in taken:
        var += "_"
    taken.add(var)
    slots.append(Slot(var=var, flag=flag, occurrence=seen[flag]))
    return var


def has_secrets(rec: ServiceRecord) -> bool:
    return bool(split_service(rec).slots)


def resolve(
    slot: Slot,
    *,
    current: ServiceLike | None,
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """The real value of ``slot``: from the current deployment, else the environment."""
    if current is not None:
        value = _from_current(slot, current)
        if value:
            return value
    env = os.environ if environ is None else environ
    value = env.get(slot.var)
    return value if value and value != REDACTED else None


def _from_current(slot: Slot, current: ServiceLike) -> str | None:
    if slot.flag is None:
        value = current.env.get(slot.var)
        return value if value and value != REDACTED else None
    count = 0
    argv = list(current.argv)
    for i, word in enumerate(argv):
        flag, eq, value = word.partition("=")
        if word == slot.flag or (eq and flag == slot.flag):
            count += 1
            if count != slot.occurrence:
                continue
            if not eq:
                value = argv[i + 1] if i + 1 < len(argv) else ""
            return value if value and value != REDACTED else None
    return None


def shell_reference(var: str) -> str:
    """``"${VAR:?...}"``: the value at paste time, or a clear error when it is unset."""
    return f'"${{{var}:?is a secret autotune does not store; set {var} first}}"'
