"""Credentials found in what runs now: never written, always a reference resolved at run time.

A deployment file is often committed, shared, pasted into issues: the tokens, keys and
passwords a service runs with must not be in it. Which values are credentials is decided by
the rules every other output of autotune follows (:mod:`autotune.secrets`: ``HF_TOKEN``,
``*_API_KEY``, ``--api-key``, ...), and the variables that carry them are named as the exports
name them (:func:`autotune.export.credentials.split_service`: ``--api-key``'s value travels
as ``AUTOTUNE_SECRET_API_KEY``), so a winner exported and imported again keeps its names.

What the deployment writes instead is ``${env:VAR}`` (:func:`autotune.templates.expand`):
read from the environment ``autotune run`` starts in, when the services are rendered, and an
error naming ``VAR`` when it is unset. A service that stays a systemd unit
(``--from-systemd``) needs no reference for a variable: the unit's own ``Environment=`` and
``EnvironmentFile=`` still apply under autotune's drop-in, so the variable is left to it.
"""

from __future__ import annotations

from autotune.export.credentials import Ref, SplitService, resolve, split_service
from autotune.init.model import RawService, SecretNote
from autotune.init.options import REFERENCE
from autotune.trial.record import ServiceRecord


def reference(var: str) -> str:
    """``${env:VAR}``: the deployment's spelling of a value read at run time."""
    return "${env:" + var + "}"


def take_secrets(service: str, raw: RawService) -> list[SecretNote]:
    """Replace every credential of ``raw`` (its argv and environment, in place) by a
    reference, or drop it when its systemd unit keeps providing it; one note each."""
    record = ServiceRecord(argv=raw.argv, env=raw.env)
    split = split_service(record)
    notes: list[SecretNote] = []
    argv: list[str] = []
    for word in split.argv:
        if isinstance(word, str):
            argv.append(word)
            continue
        argv.append(_flag_word(service, word, split, record, notes))
    env = dict(split.env)
    unit = raw.manager == "systemd"
    for slot in split.slots:
        if slot.flag is not None:
            continue
        value = raw.env[slot.var]
        origin = raw.env_origin.get(slot.var, "")
        if unit and slot.var not in raw.env_refs:
            notes.append(SecretNote(service, slot.what + " " + slot.var, slot.var, True, origin))
            continue
        env[slot.var] = reference(slot.var)
        if value == reference(slot.var) and not origin:
            origin = "the source's own reference"
        notes.append(SecretNote(service, f"{slot.what} {slot.var}", slot.var, False, origin))
    raw.argv = argv
    raw.env = {k: env[k] for k in raw.env if k in env}
    return notes


def _flag_word(
    service: str, word: Ref, split: SplitService, record: ServiceRecord, notes: list[SecretNote]
) -> str:
    """The argv word that carries a secret flag's value, as a reference."""
    slot = next(s for s in split.slots if s.var == word.var)
    value = resolve(slot, current=record, environ={}) or ""
    if REFERENCE.fullmatch(value):  # already read at run time (a secretKeyRef, ${VAR})
        var = value[len("${env:") : -1]
        notes.append(SecretNote(service, slot.what, var, origin="the source's own reference"))
        return word.prefix + value
    notes.append(SecretNote(service, slot.what, slot.var))
    return word.prefix + reference(slot.var)
