"""Moving a study from one storage to another without loss (``autotune migrate``).

Everything autotune keeps about a study lives in Optuna's tables: trials with their values,
parameters, constraints and attributes, WAITING trials (enqueued baseline and retries, their
parameters in the ``fixed_params`` system attribute), re-measurements (study user attributes
``remeasure:N:R``), the correctness reference, and the coordination of several workers
(study system attributes ``autotune:worker:*`` and ``autotune:claim:*``). A migration copies
all of it and then proves it did: both studies are read back and compared field by field.

The copy is one transaction on the target: the study's rows, table by table, as they are
stored (trial datetimes stay the stored UTC values, attribute JSON stays the stored text), so
a failed or interrupted copy leaves nothing there. A copy that does not verify is deleted
before the error is raised. ``optuna.copy_study`` would do the same job but rebuilds every
trial through the ORM (about 40 ms a trial here, one transaction each) and round-trips
datetimes through local time; it stays the fallback for an Optuna without the RDB models.

The source is only read. A study with RUNNING trials is refused: its workers are still
writing to it (and a tuner that died mid-trial left its measurement in a journal keyed to
the source URL, which only an ``autotune run`` on the source settles).

This module reads and checks the source, copies the study and reports what moved; the
field-by-field comparison of the copy with its source is in
autotune/study/_migrate_verify.py (``compare_studies``, re-exported here).
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
import sqlalchemy.exc
from optuna.trial import TrialState

from autotune.errors import StorageError
from autotune.study._migrate_verify import (
    MAX_LISTED,
    TRIAL_FIELDS,
    _verify,
    compare_studies,
)
from autotune.study.interrupts import deferred_interrupts
from autotune.study.storage import (
    STORAGE_EXCEPTIONS,
    _sqlite_path,
    describe_storage_failure,
    display_url,
    open_storage,
    storage_errors,
)
from autotune.trial.record import TrialRecord

try:  # Optuna internals: the RDB tables, copied row by row (checked, with copy_study fallback).
    from autotune.study._optuna_compat import rdb_models as _rdb_models

    _METADATA: sqlalchemy.MetaData | None = _rdb_models.BaseModel.metadata
    _HAVE_MODELS = all(hasattr(_rdb_models, n) for n in ("StudyModel", "TrialModel"))
except ImportError:  # pragma: no cover - another Optuna layout: optuna.copy_study
    _METADATA = None
    _HAVE_MODELS = False
_ROW_COPY = _HAVE_MODELS
"""Copy rows (else ``optuna.copy_study``); tests switch it off to exercise the fallback."""

__all__ = [
    "MAX_LISTED",
    "PROGRESS_EVERY",
    "TRIAL_FIELDS",
    "WORKER_ATTR",
    "MigrationReport",
    "Progress",
    "compare_studies",
    "migrate_study",
]

WORKER_ATTR = "autotune:worker"
"""Trial system attribute: the worker that asked the trial."""
PROGRESS_EVERY = 250
"""Trials between two progress lines while copying."""

Progress = Callable[[str], None]


@dataclass(frozen=True)
class MigrationReport:
    """What a migration copied; ``verified`` is True once both sides compared equal."""

    study_name: str
    source: str
    """Source URL without its password."""
    target: str
    trials: dict[str, int]
    """Trials copied per state name (``COMPLETE``, ``FAIL``, ``WAITING``, ...)."""
    study_user_attrs: int
    study_system_attrs: int
    seconds: float
    method: str = "rows"
    """``rows`` (one transaction, rows as stored) or ``copy_study`` (Optuna's own)."""
    verified: bool = True
    directions: list[str] = field(default_factory=list)
    schema_versions: dict[str, int] = field(default_factory=dict)
    """Trials per stored-record version (``autotune.trial.record``): ``"1"``, ``"2"``;
    ``"unreadable"`` for attributes that do not follow the schema (copied as they are)."""

    @property
    def total_trials(self) -> int:
        return sum(self.trials.values())


def migrate_study(
    *,
    source_url: str,
    target_url: str,
    study_name: str | None,
    progress: Progress | None = None,
) -> MigrationReport:
    """Copy study ``study_name`` (the only one when None) from ``source_url`` to ``target_url``.

    Refuses, writing nothing, when the target already holds a study of that name or the
    source study has RUNNING trials. The copy is verified field by field against the source;
    a copy that differs, fails or is interrupted (Ctrl-C) is removed from the target before
    the exception propagates. The source is never written.
    """
    say = progress or (lambda _line: None)
    started = time.monotonic()
    _check_sqlite_source(source_url)
    source = open_storage(source_url, create=False)
    target: optuna.storages.BaseStorage | None = None
    try:
        with storage_errors(source_url, "reading the source study"):
            name = _pick_study(source, study_name, source_url)
            source_id = source.get_study_id_from_name(name)
            _refuse_running(source, source_id, name, source_url)
            states = {
                s.name: n for s in TrialState if (n := source.get_n_trials(source_id, state=s))
            }
            user_attrs = source.get_study_user_attrs(source_id)
            system_attrs = source.get_study_system_attrs(source_id)
            versions = _schema_versions(source, source_id)
            directions = source.get_study_directions(source_id)
        say(
            f"study {name!r} in {display_url(source_url)}: {sum(states.values())} trials ("
            + (", ".join(f"{n} {s.lower()}" for s, n in states.items()) or "none")
            + f"), {len(user_attrs)} user and {len(system_attrs)} system study attributes"
        )
        new_file = _new_sqlite_file(target_url)
        target = open_storage(target_url, create=True)
        use_rows = _ROW_COPY and all(
            isinstance(s, optuna.storages.RDBStorage) for s in (source, target)
        )
        try:
            _copy_and_verify(source, target, name, source_id, source_url, target_url, say, use_rows)
        except BaseException:
            _forget_new_file(target, new_file)
            raise
    finally:
        for storage in (source, target):
            with contextlib.suppress(Exception):
                storage.engine.dispose()  # type: ignore[union-attr,attr-defined]
    return MigrationReport(
        study_name=name,
        source=display_url(source_url),
        target=display_url(target_url),
        trials=states,
        study_user_attrs=len(user_attrs),
        study_system_attrs=len(system_attrs),
        seconds=time.monotonic() - started,
        method="rows" if use_rows else "copy_study",
        directions=[d.name.lower() for d in directions],
        schema_versions=versions,
    )


def _schema_versions(storage: optuna.storages.BaseStorage, study_id: int) -> dict[str, int]:
    """How many trials of the study carry each version of the trial record."""
    counts: dict[str, int] = {}
    for trial in storage.get_all_trials(study_id, deepcopy=False):
        try:
            version = str(TrialRecord.from_attrs(trial.user_attrs).schema_version)
        except StorageError:
            version = "unreadable"
        counts[version] = counts.get(version, 0) + 1
    return dict(sorted(counts.items()))


def _copy_and_verify(
    source: optuna.storages.BaseStorage,
    target: optuna.storages.BaseStorage,
    name: str,
    source_id: int,
    source_url: str,
    target_url: str,
    say: Progress,
    use_rows: bool,
) -> None:
    """Copy and compare; whatever stops it after the copy began removes the copy."""
    with storage_errors(target_url, "reading the target storage"):
        held = [s.study_name for s in target.get_all_studies()]
    if name in held:
        same = display_url(source_url) == display_url(target_url)
        raise StorageError(
            f"{display_url(target_url)} already holds a study named {name!r}"
            + (" (source and target are the same storage)" if same else "")
            + "; nothing was copied. Migrate to another storage, or delete that study "
            "first if it is an old copy"
        )
    try:
        say(f"copying to {display_url(target_url)}")
        if use_rows:
            _copy_rows(source, target, source_id, name, source_url, target_url, say)
        else:
            _copy_with_optuna(source, target, name, source_url, target_url)
        say("verifying the copy field by field")
        _verify(source, target, name, source_url, target_url)
    except _CreatedMeanwhile:
        raise  # someone else's study: not ours to delete
    except BaseException:
        _discard(target, name, target_url)
        raise


# --------------------------------------------------------------------------- checks


def _check_sqlite_source(url: str) -> None:
    """An SQLite source that is not an Optuna storage is refused before Optuna opens it
    (opening creates Optuna's tables: the source would be written)."""
    path = _sqlite_path(url)
    if path is None or not path.is_file():
        return  # not SQLite, or missing: open_storage says so
    try:
        with contextlib.closing(
            sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        ) as db:
            found = db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'studies'"
            ).fetchone()
    except sqlite3.Error as exc:
        raise StorageError(
            f"cannot read {path}: {describe_storage_failure(exc, url=url)}"
        ) from None
    if found is None:
        raise StorageError(f"{path} is not an Optuna study database (it has no studies table)")


def _pick_study(storage: optuna.storages.BaseStorage, name: str | None, url: str) -> str:
    names = [s.study_name for s in storage.get_all_studies()]
    where = display_url(url)
    if name is None:
        if len(names) == 1:
            return names[0]
        if not names:
            raise StorageError(f"{where} holds no study: nothing to migrate")
        raise StorageError(
            f"{where} holds {len(names)} studies ({', '.join(sorted(names))}); "
            "choose one with --study NAME"
        )
    if name not in names:
        raise StorageError(
            f"no study named {name!r} in {where}"
            + (f" (studies: {', '.join(sorted(names))})" if names else " (it holds no study)")
        )
    return name


def _refuse_running(
    storage: optuna.storages.BaseStorage, study_id: int, name: str, url: str
) -> None:
    running = storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,))
    if not running:
        return
    shown = []
    for trial in running[:MAX_LISTED]:
        worker = trial.system_attrs.get(WORKER_ATTR)
        shown.append(f"#{trial.number}" + (f" on worker {worker}" if worker else ""))
    if len(running) > MAX_LISTED:
        shown.append(f"{len(running) - MAX_LISTED} more")
    count = f"{len(running)} RUNNING trial" + ("s" if len(running) > 1 else "")
    raise StorageError(
        f"study {name!r} in {display_url(url)} has {count} ({', '.join(shown)}): workers are "
        "still writing to it, so a copy now would miss what they store next. Stop them "
        "(Ctrl-C) or let them finish, then migrate again. A trial left RUNNING by a worker "
        "that died is settled by the next `autotune run` on this storage (it records the "
        "measurement from its journal or fails and retries the trial). Nothing was copied"
    )


# --------------------------------------------------------------------------- copying


class _CreatedMeanwhile(StorageError):
    """The target got a study of that name after the check: someone else's, left alone."""

    def __init__(self, url: str, name: str) -> None:
        super().__init__(
            f"{display_url(url)} already holds a study named {name!r} (created while "
            "migrating); nothing was copied"
        )


def _table_roles() -> tuple[
    sqlalchemy.Table, sqlalchemy.Table, list[sqlalchemy.Table], list[sqlalchemy.Table]
]:
    """(studies, trials, tables keyed by study_id, tables keyed by trial_id), from Optuna's
    own model metadata, so a table a later Optuna adds to a study or trial is copied too."""
    assert _METADATA is not None
    studies = _rdb_models.StudyModel.__table__
    trials = _rdb_models.TrialModel.__table__
    by_study, by_trial = [], []
    for table in _METADATA.sorted_tables:
        if table is studies or table is trials:
            continue
        if "trial_id" in table.c:
            by_trial.append(table)
        elif "study_id" in table.c:
            by_study.append(table)
    return studies, trials, by_study, by_trial


def _row(row: Mapping[Any, Any], table: sqlalchemy.Table, **ids: Any) -> dict[str, Any]:
    """A stored row for insertion elsewhere: own primary key dropped (the target assigns
    one), ``study_id`` / ``trial_id`` replaced by the target's."""
    out = {}
    for column in table.columns:
        if column.name in ids:
            if ids[column.name] is not None:
                out[column.name] = ids[column.name]
        elif not column.primary_key:
            out[column.name] = row[column.name]
    return out


def _copy_rows(
    source: optuna.storages.BaseStorage,
    target: optuna.storages.BaseStorage,
    source_id: int,
    name: str,
    source_url: str,
    target_url: str,
    say: Progress,
) -> None:
    """Read the study's rows from the source, write them to the target in one transaction."""
    studies, trials, by_study, by_trial = _table_roles()
    source_engine: sqlalchemy.Engine = source.engine  # type: ignore[attr-defined]
    target_engine: sqlalchemy.Engine = target.engine  # type: ignore[attr-defined]
    with storage_errors(source_url, "reading the source study"), source_engine.connect() as conn:
        if source_engine.dialect.name != "sqlite":  # one snapshot for all the tables
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
        study_row = (
            conn.execute(sqlalchemy.select(studies).where(studies.c.study_id == source_id))
            .mappings()
            .one()
        )
        study_rows = {
            t: _rows(conn, sqlalchemy.select(t).where(t.c.study_id == source_id), t)
            for t in by_study
        }
        trial_rows = _rows(
            conn, sqlalchemy.select(trials).where(trials.c.study_id == source_id), trials
        )
        ids = sqlalchemy.select(trials.c.trial_id).where(trials.c.study_id == source_id)
        trial_child_rows = {
            t: _rows(conn, sqlalchemy.select(t).where(t.c.trial_id.in_(ids)), t) for t in by_trial
        }
    try:
        with target_engine.begin() as conn:
            try:
                study_id = _insert(conn, studies, _row(study_row, studies, study_id=None))
            except sqlalchemy.exc.IntegrityError:
                raise _CreatedMeanwhile(target_url, name) from None
            for table, rows in study_rows.items():
                if rows:
                    conn.execute(table.insert(), [_row(r, table, study_id=study_id) for r in rows])
            new_ids: dict[int, int] = {}
            for done, r in enumerate(trial_rows, start=1):
                new_ids[r["trial_id"]] = _insert(
                    conn, trials, _row(r, trials, study_id=study_id, trial_id=None)
                )
                if done % PROGRESS_EVERY == 0 and done < len(trial_rows):
                    say(f"copied {done}/{len(trial_rows)} trials")
            for table, rows in trial_child_rows.items():
                if rows:
                    conn.execute(
                        table.insert(),
                        [_row(r, table, trial_id=new_ids[r["trial_id"]]) for r in rows],
                    )
    except STORAGE_EXCEPTIONS as exc:
        raise StorageError(
            f"writing study {name!r} to {display_url(target_url)} failed (nothing was "
            f"kept there): {describe_storage_failure(exc, url=target_url)}"
        ) from exc
    say(f"copied {len(trial_rows)}/{len(trial_rows)} trials")


def _insert(conn: sqlalchemy.Connection, table: sqlalchemy.Table, row: dict[str, Any]) -> int:
    """Insert one row; the primary key the target assigned to it."""
    key = conn.execute(table.insert().values(row)).inserted_primary_key
    assert key is not None
    return int(key[0])


def _rows(conn: sqlalchemy.Connection, query: Any, table: sqlalchemy.Table) -> list[Any]:
    return list(conn.execute(query.order_by(*table.primary_key.columns)).mappings().all())


def _copy_with_optuna(
    source: optuna.storages.BaseStorage,
    target: optuna.storages.BaseStorage,
    name: str,
    source_url: str,
    target_url: str,
) -> None:
    """``optuna.copy_study``; a partial copy (error, Ctrl-C) is removed from the target."""
    try:
        optuna.copy_study(
            from_study_name=name, from_storage=source, to_storage=target, to_study_name=name
        )
    except optuna.exceptions.DuplicatedStudyError:
        raise _CreatedMeanwhile(target_url, name) from None
    except STORAGE_EXCEPTIONS as exc:
        raise StorageError(
            f"copying study {name!r} from {display_url(source_url)} to "
            f"{display_url(target_url)} failed (the partial copy is removed): "
            f"{describe_storage_failure(exc)}"
        ) from exc


def _discard(target: optuna.storages.BaseStorage, name: str, target_url: str) -> None:
    """Delete the (partial or unverified) copy; StorageError when even that fails."""
    try:
        with deferred_interrupts():
            study_id = target.get_study_id_from_name(name)
            target.delete_study(study_id)
    except KeyError:
        return  # nothing was committed
    except Exception as exc:
        raise StorageError(
            f"the migration failed and its partial copy could not be removed: delete study "
            f"{name!r} from {display_url(target_url)} before trying again "
            f"(optuna delete-study --study-name {name} --storage URL): "
            f"{describe_storage_failure(exc, url=target_url)}"
        ) from exc


def _new_sqlite_file(url: str) -> Path | None:
    """The SQLite file the target URL names, when it does not exist yet."""
    path = _sqlite_path(url)
    return path if path is not None and not path.exists() else None


def _forget_new_file(target: optuna.storages.BaseStorage, path: Path | None) -> None:
    """A target SQLite file this migration created and that holds no study is removed."""
    if path is None:
        return
    with contextlib.suppress(Exception):
        if target.get_all_studies():
            return
        target.engine.dispose()  # type: ignore[attr-defined]
        for suffix in ("", "-journal", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
