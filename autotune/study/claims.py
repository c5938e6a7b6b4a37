"""Claims: a configuration belongs to one trial before anything is launched for it.

Several workers share one study; Optuna's constant liar makes them *unlikely* to propose the
same configuration while one is in flight, not unable to. A claim makes it impossible: before
a worker launches a configuration it inserts ``autotune:claim:<digest>`` = its trial number
into the study's system attributes. That table has a unique (study, key) constraint, so of
two workers inserting the same key in the same instant exactly one succeeds, on SQLite and
PostgreSQL alike (a plain INSERT; the loser gets an integrity error, nothing is
overwritten). Optuna's own ``set_study_system_attr`` cannot serve: it overwrites.

The loser reads the owner: a COMPLETE owner's result is reused, a RUNNING one is in flight
(the loser does not launch), a FAIL owner (its worker died or was interrupted) can be taken
over with a compare-and-swap on the stored owner, so exactly one retry runs the config.

Claims live in Optuna's tables, so they travel with the study (``autotune migrate``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass

import optuna
import sqlalchemy
import sqlalchemy.exc
from optuna.trial import TrialState

from autotune.errors import AutotuneError
from autotune.study._optuna_compat import rdb_models as _rdb_models
from autotune.study._optuna_compat import rdb_of as _rdb
from autotune.study._optuna_compat import storage_of, study_id_of, trial_by_number
from autotune.study.workers import TRIAL_WORKER_ATTR

CLAIM_PREFIX = "autotune:claim:"
BASELINE_CLAIM = f"{CLAIM_PREFIX}baseline"
"""Held by whichever worker enqueued the baseline of a new study."""
REMEASURE_CLAIM = f"{CLAIM_PREFIX}remeasure:"
"""``autotune:claim:remeasure:N:R``: held by the worker that measures re-measurement R of
trial N (its own number, ``1 << 40`` + a digest of its name: no trial has it)."""


def remeasure_claim_key(number: int, repeat: int) -> str:
    return f"{REMEASURE_CLAIM}{number}:{repeat}"


def remeasure_claims(study: optuna.Study) -> dict[tuple[int, int], int]:
    """Every re-measurement claimed on the study: (trial, repeat) -> the owner's number."""
    attrs = storage_of(study).get_study_system_attrs(study_id_of(study))
    out = {}
    for key, value in attrs.items():
        if not key.startswith(REMEASURE_CLAIM):
            continue
        number, _, repeat = key[len(REMEASURE_CLAIM) :].partition(":")
        try:
            out[(int(number), int(repeat))] = int(value)
        except (TypeError, ValueError):
            continue
    return out


@dataclass(frozen=True)
class Claim:
    """The outcome of :func:`claim`: ``won`` or not, and the trial number that owns it."""

    won: bool
    owner: int


def claim_key(config_key: str) -> str:
    """The attribute key of a canonical configuration key (a digest: keys are length-capped)."""
    digest = hashlib.sha1(config_key.encode("utf-8")).hexdigest()[:24]
    return f"{CLAIM_PREFIX}{digest}"


def claim(study: optuna.Study, key: str, number: int) -> Claim:
    """Insert ``key`` = ``number`` unless present; who owns it afterwards."""
    rdb = _rdb(storage_of(study))
    if rdb is None:  # in-memory storage: one process, check-then-set is exact
        attrs = storage_of(study).get_study_system_attrs(study_id_of(study))
        if key in attrs:
            return Claim(won=int(attrs[key]) == number, owner=int(attrs[key]))
        storage_of(study).set_study_system_attr(study_id_of(study), key, number)
        return Claim(won=True, owner=number)
    table = _rdb_models.StudySystemAttributeModel.__table__
    try:
        with rdb.engine.begin() as conn:
            conn.execute(
                table.insert().values(
                    study_id=study_id_of(study), key=key, value_json=json.dumps(number)
                )
            )
        return Claim(won=True, owner=number)
    except sqlalchemy.exc.IntegrityError:
        pass
    owner = owner_of(study, key)
    if owner is None:  # released in between (not done by autotune): try once more
        return claim(study, key, number)
    return Claim(won=owner == number, owner=owner)


def owner_of(study: optuna.Study, key: str) -> int | None:
    """The trial number that holds ``key``, read from the database (never from a cache)."""
    rdb = _rdb(storage_of(study))
    if rdb is None:
        value = storage_of(study).get_study_system_attrs(study_id_of(study)).get(key)
        return None if value is None else int(value)
    table = _rdb_models.StudySystemAttributeModel.__table__
    with rdb.engine.connect() as conn:
        raw = conn.execute(
            sqlalchemy.select(table.c.value_json).where(
                table.c.study_id == study_id_of(study), table.c.key == key
            )
        ).scalar_one_or_none()
    return None if raw is None else int(json.loads(raw))


def take_over(study: optuna.Study, key: str, *, previous: int, number: int) -> bool:
    """Move ``key`` from trial ``previous`` (finished without a result) to ``number``.

    A compare-and-swap: of several workers taking over the same claim, one succeeds.
    """
    rdb = _rdb(storage_of(study))
    if rdb is None:
        if owner_of(study, key) != previous:
            return False
        storage_of(study).set_study_system_attr(study_id_of(study), key, number)
        return True
    table = _rdb_models.StudySystemAttributeModel.__table__
    with rdb.engine.begin() as conn:
        done = conn.execute(
            table.update()
            .where(
                table.c.study_id == study_id_of(study),
                table.c.key == key,
                table.c.value_json == json.dumps(previous),
            )
            .values(value_json=json.dumps(number))
        )
    return done.rowcount == 1


class ClaimedElsewhere(AutotuneError):
    """The proposed configuration is being measured by another trial (another worker)."""

    def __init__(self, owner: int, worker: str | None) -> None:
        by = f" (worker {worker})" if worker else ""
        super().__init__(f"the same configuration is being measured by trial #{owner}{by}")
        self.owner = owner


def claim_config(
    study: optuna.Study,
    config_key: str,
    number: int,
    *,
    db: Callable[[str, Callable[[], Claim]], Claim],
) -> int | None:
    """Claim the configuration ``config_key`` for trial ``number``: None when it is ours to
    launch, else the COMPLETE trial (another worker's) whose result it reuses.

    ``db`` runs a database call with the caller's retry policy. Raises
    :class:`ClaimedElsewhere` when the owner is still in flight.
    """
    key = claim_key(config_key)
    for _ in range(5):
        got = db("claiming the configuration", lambda: claim(study, key, number))
        if got.won:
            return None
        owner = trial_by_number(study, got.owner)
        if owner.state == TrialState.COMPLETE:
            return owner.number
        if owner.state == TrialState.FAIL:  # its worker died or was stopped: take it over
            if take_over(study, key, previous=owner.number, number=number):
                return None
            continue
        raise ClaimedElsewhere(owner.number, owner.system_attrs.get(TRIAL_WORKER_ATTR))
    raise ClaimedElsewhere(number, None)
