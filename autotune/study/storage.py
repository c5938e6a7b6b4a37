"""Opening the study storage: SQLite by default, any SQLAlchemy URL Optuna accepts.

Kept apart from the loop so every command (run, best, report, dashboard) resolves the
same default and gives the same clear error for a bad URL or an unreadable file.
"""

from __future__ import annotations

import json
import os
import random
import re
import sqlite3
import time
from collections.abc import Callable, Container, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import optuna
import sqlalchemy.exc
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.engine import make_url

from autotune.errors import ConfigError, StorageError

STUDIES_DIR = Path("studies")
SQLITE_WAIT_S = 30.0
"""How long a write waits for another process's lock; ``?timeout=S`` in the URL overrides."""
SERVER_CONNECT_TIMEOUT_S = 10
"""PostgreSQL/MySQL connect timeout unless the URL sets ``connect_timeout=``."""
STUDY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def check_study_name(name: str, *, field: str = "--study") -> str:
    """A study name becomes a file name (``studies/NAME.db``, ``studies/runs/NAME``)."""
    if not STUDY_NAME.fullmatch(name) or ".." in name:
        raise ConfigError(
            f"invalid study name {name!r}: use 1-100 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit, without '..'",
            field=field,
        )
    return name


def default_storage_url(study_name: str, *, studies_dir: Path = STUDIES_DIR) -> str:
    """``sqlite:///studies/NAME.db`` (relative to the working directory)."""
    check_study_name(study_name)
    return f"sqlite:///{studies_dir / (study_name + '.db')}"


def display_url(url: str) -> str:
    """The URL without its password, for messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL at all: nothing in it to hide but the whole thing
        return url if "@" not in url else "<unparseable storage URL>"


_CAUSES = (
    ("database is locked", "the database is locked by another process (a write waited "
     "for the lock and gave up; raise the wait with ?timeout=SECONDS in the URL)"),
    ("disk is full", "the disk holding it is full"),
    ("no space left", "the disk holding it is full"),
    ("readonly", "it is read-only (file, directory or file system)"),
    ("read-only", "it is read-only (file, directory or file system)"),
    ("unable to open database file", "the file cannot be opened (missing directory or "
     "no permission)"),
    ("disk i/o error", "the disk reported an I/O error"),
    ("malformed", "the database file is corrupt"),
    ("not a database", "the file is not an SQLite database"),
)  # fmt: skip


def _diagnose_sqlite(path: Path) -> str | None:
    """What is wrong with the place an SQLite file lives, when SQLite's words are vague
    ("unable to open database file" for a directory that became read-only)."""
    directory = path.parent if path.parent != Path("") else Path(".")
    try:
        fs = os.statvfs(directory)
    except OSError:
        return f"its directory {directory} is not accessible"
    if fs.f_flag & os.ST_RDONLY:
        return f"it is on a read-only file system ({directory})"
    for target in (directory, path):
        if target.exists() and not os.access(target, os.W_OK):
            return f"{target} is read-only (permissions or immutable attribute)"
    if fs.f_bavail * fs.f_frsize < 256 * 1024:
        return f"the disk holding {directory} is full"
    return None


def describe_storage_failure(exc: BaseException, *, url: str | None = None) -> str:
    """The root cause of a storage exception in words (Optuna wraps the SQL error)."""
    texts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(texts) < 8:
        texts.append(str(seen))
        seen = seen.__cause__ or seen.__context__
    joined = " | ".join(texts).lower()
    causes = [words for needle, words in _CAUSES if needle in joined]
    if causes and "locked" in causes[0]:
        return causes[0]
    path = _sqlite_path(url) if url else None
    found = _diagnose_sqlite(path) if path is not None else None
    if found is not None:
        return found
    if causes:
        return causes[0]
    root = texts[-1].splitlines()[0] if texts and texts[-1] else type(exc).__name__
    return root[:300]


STORAGE_EXCEPTIONS: tuple[type[BaseException], ...] = (
    sqlalchemy.exc.SQLAlchemyError,
    optuna.exceptions.StorageInternalError,
)


_T = TypeVar("_T")


class Retry(Protocol):
    """How a storage call is run: ``retry(what, fn)`` returns ``fn()``'s result."""

    def __call__(self, what: str, fn: Callable[[], _T], /) -> _T: ...


DB_RETRY_S = 300.0
"""How long a worker waits for a database server that went away before it gives up."""
_RETRY_FIRST_S = 0.5
_RETRY_MAX_S = 15.0
_CONNECTION_ERRORS = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.DisconnectionError,
)


def is_server_url(url: str) -> bool:
    """A database server (PostgreSQL, MySQL): connections can drop and come back."""
    return url.split(":", 1)[0].split("+", 1)[0] in ("postgresql", "postgres", "mysql")


def is_transient(exc: BaseException, *, url: str) -> bool:
    """``exc`` is a lost or refused connection to a database server (worth retrying).

    SQLite's operational errors (locked, full, read-only) are not: they are reported at once.
    """
    if not is_server_url(url):
        return False
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, _CONNECTION_ERRORS):
            return True
        current = current.__cause__ or current.__context__
    return False


def retrying(
    fn: Callable[[], _T],
    *,
    url: str,
    what: str,
    on_wait: Callable[[str], None],
    first: BaseException | None = None,
    budget_s: float = DB_RETRY_S,
    stop: Callable[[], bool] | None = None,
) -> _T:
    """``fn()``, again with exponential backoff (0.5 s doubling to 15 s, for ``budget_s``)
    while it fails because the database server cannot be reached; other errors, and any
    error on SQLite, go straight to the caller. ``first``: an attempt already failed.
    ``stop()`` true (the user pressed Ctrl-C meanwhile) ends the waiting with the failure."""
    deadline = time.monotonic() + budget_s
    delay = _RETRY_FIRST_S
    failure = first
    while True:
        if failure is not None:
            if not is_transient(failure, url=url) or time.monotonic() + delay > deadline:
                raise failure
            on_wait(
                f"lost the database while {what} ({describe_storage_failure(failure, url=url)});"
                f" retrying in {delay:.1f} s (giving up after {budget_s:.0f} s)"
            )
            until = time.monotonic() + delay
            while time.monotonic() < until:
                if stop is not None and stop():
                    raise failure
                time.sleep(min(0.1, until - time.monotonic()))
            delay = min(2 * delay, _RETRY_MAX_S)
        try:
            return fn()
        except STORAGE_EXCEPTIONS as exc:
            failure = exc


@contextmanager
def storage_errors(url: str, doing: str) -> Iterator[None]:
    """Turn a failed read or write into one StorageError that says where and why."""
    try:
        yield
    except STORAGE_EXCEPTIONS as exc:
        raise StorageError(
            f"{doing} in {display_url(url)} failed: {describe_storage_failure(exc, url=url)}"
        ) from exc


def _sqlite_path(url: str) -> Path | None:
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        return None
    rest = url[len(prefix) :].split("?", 1)[0]
    return Path(rest) if rest and rest != ":memory:" else None


def with_driver(url: str) -> str:
    """``postgresql://`` with the PostgreSQL driver that is installed.

    SQLAlchemy 2.1 reads a plain ``postgresql://`` as psycopg 3; autotune's ``postgres``
    extra installs psycopg2 (a binary wheel). ``postgres://`` (Heroku style) is read too.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("postgresql", "postgres"):
        return url
    import importlib.util

    if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2"):
        return f"postgresql+psycopg2://{rest}"
    return f"postgresql://{rest}"


def open_storage(url: str, *, create: bool) -> optuna.storages.BaseStorage:
    """An Optuna RDB storage for ``url``; StorageError with the reason when it cannot open."""
    path = _sqlite_path(url)
    if path is not None:
        if not create and not path.exists():
            raise StorageError(f"no study database at {path} (run `autotune run` first)")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create {path.parent}: {exc.strerror}") from None
    engine_kwargs: dict[str, object] = {}
    if path is not None and "timeout=" not in url:
        engine_kwargs = {"connect_args": {"timeout": SQLITE_WAIT_S}}
    elif path is None and is_server_url(url):
        # A database server that does not answer must not hang the tuner: bounded connect,
        # and a pooled connection the server dropped is replaced, not used.
        engine_kwargs = {"pool_pre_ping": True}
        if "connect_timeout=" not in url:
            engine_kwargs["connect_args"] = {"connect_timeout": SERVER_CONNECT_TIMEOUT_S}
    for attempt in range(SCHEMA_RACE_TRIES):
        try:
            return optuna.storages.RDBStorage(with_driver(url), engine_kwargs=engine_kwargs)
        except Exception as exc:  # SQLAlchemy raises many types; the user needs one message.
            if attempt + 1 < SCHEMA_RACE_TRIES and _lost_schema_race(exc):
                # Several workers started at once on an empty database all create Optuna's
                # tables; all but one lose (duplicate type or key). Once they exist, opening
                # is a read: try again after a moment.
                time.sleep(random.uniform(0.2, 1.0))
                continue
            raise StorageError(
                f"cannot open storage {display_url(url)}: {describe_storage_failure(exc, url=url)}"
            ) from None
    raise AssertionError("unreachable")


SCHEMA_RACE_TRIES = 6


def _lost_schema_race(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, sqlalchemy.exc.SQLAlchemyError) and (
        "already exists" in text or "duplicate key" in text or "unique constraint" in text
    )


try:  # Optuna internals: one transaction for many writes (checked, with a plain fallback).
    from optuna.storages._cached_storage import _CachedStorage
    from optuna.storages._rdb import models as _rdb_models
    from optuna.storages._rdb.storage import _create_scoped_session

    _CAN_BATCH = all(
        hasattr(optuna.storages.RDBStorage, name)
        for name in ("_set_trial_param_without_commit", "_set_trial_attr_without_commit")
    )
except ImportError:  # pragma: no cover - another Optuna layout: writes stay one by one
    _CAN_BATCH = False
    _CachedStorage = object  # type: ignore[assignment,misc]


class BatchingStorage(_CachedStorage):  # type: ignore[misc,valid-type]
    """Optuna's cached RDB storage, plus :meth:`batch`: a trial's writes in one transaction.

    Every ``set_trial_param`` / ``set_trial_user_attr`` / ``set_trial_system_attr`` is its
    own SQLite commit (an fsync each: 4-20 ms on the development VM), and a trial makes
    about 40 of them (16 parameters, 20 attributes, constraints). Inside ``batch(trial_id)``
    those writes are held in memory and committed together when the block ends, so a block
    is all or nothing. That is within Optuna's contract for this class (writes to a trial
    are guaranteed durable once its state changes) and stricter than it: the loop flushes
    the parameters before it launches anything and the attributes before it tells the
    state. Writes outside a block, and to other trials, go straight through.
    """

    def __init__(
        self,
        backend: optuna.storages.RDBStorage,
        *,
        retry: Retry | None = None,
    ) -> None:
        super().__init__(backend)
        self._batch: tuple[int, list[tuple[str, Any]]] | None = None
        self._retry = retry
        """Runs each storage call (e.g. :func:`retrying` while a database server is away)."""

    def _call(self, what: str, fn: Callable[[], _T]) -> _T:
        return fn() if self._retry is None else self._retry(what, fn)

    # Reads and idempotent writes: retried as they are while the server is away.
    def get_trial(self, trial_id: int) -> FrozenTrial:
        return self._call(
            "reading a trial", lambda: super(BatchingStorage, self).get_trial(trial_id)
        )

    def get_all_trials(
        self, study_id: int, deepcopy: bool = True, states: Container[TrialState] | None = None
    ) -> list[FrozenTrial]:
        return self._call(
            "reading the trials",
            lambda: super(BatchingStorage, self).get_all_trials(study_id, deepcopy, states),
        )

    def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
        return self._call(
            "reading the study",
            lambda: super(BatchingStorage, self).get_study_system_attrs(study_id),
        )

    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        return self._call(
            "reading the study", lambda: super(BatchingStorage, self).get_study_user_attrs(study_id)
        )

    def set_study_system_attr(self, study_id: int, key: str, value: Any) -> None:
        self._call(
            "writing the study",
            lambda: super(BatchingStorage, self).set_study_system_attr(study_id, key, value),
        )

    def set_study_user_attr(self, study_id: int, key: str, value: Any) -> None:
        self._call(
            "writing the study",
            lambda: super(BatchingStorage, self).set_study_user_attr(study_id, key, value),
        )

    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        return self._call(
            "reading a trial",
            lambda: super(BatchingStorage, self).get_trial_id_from_study_id_trial_number(
                study_id, trial_number
            ),
        )

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        # Not idempotent: a trial created just before the connection dropped stays RUNNING
        # without heartbeat or owner, and is failed as lost once its lease is over.
        return self._call(
            "creating a trial",
            lambda: super(BatchingStorage, self).create_new_trial(study_id, template_trial),
        )

    def set_trial_state_values(
        self, trial_id: int, state: TrialState, values: Sequence[float] | None = None
    ) -> bool:
        attempts = 0

        def once() -> bool:
            nonlocal attempts
            attempts += 1
            if attempts > 1:  # the first attempt may have been committed after all
                current = self._backend.get_trial(trial_id)
                if current.state == state:
                    return True
            return super(BatchingStorage, self).set_trial_state_values(trial_id, state, values)

        return self._call("writing a trial's state", once)

    @property
    def url(self) -> str:
        return str(self._backend.url)

    @contextmanager
    def batch(self, trial_id: int) -> Iterator[None]:
        """Hold the writes to ``trial_id`` in the block; commit them together at its end.

        When the block raises, the held writes are dropped (nothing of it reaches storage).
        """
        if self._batch is not None:
            yield  # already batching: the outer block commits
            return
        self._batch = (trial_id, [])
        try:
            yield
            pending = self._batch[1]
        finally:
            self._batch = None
        self._call("writing a trial", lambda: self._flush(trial_id, pending))

    def _held(self, trial_id: int) -> list[tuple[str, Any]] | None:
        batch = self._batch
        return batch[1] if batch is not None and batch[0] == trial_id else None

    def set_trial_param(
        self,
        trial_id: int,
        param_name: str,
        param_value_internal: float,
        distribution: optuna.distributions.BaseDistribution,
    ) -> None:
        held = self._held(trial_id)
        if held is None:
            self._call(
                "writing a trial",
                lambda: super(BatchingStorage, self).set_trial_param(
                    trial_id, param_name, param_value_internal, distribution
                ),
            )
        else:
            held.append(("param", (param_name, param_value_internal, distribution)))

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        held = self._held(trial_id)
        if held is None:
            self._call(
                "writing a trial",
                lambda: super(BatchingStorage, self).set_trial_user_attr(trial_id, key, value),
            )
        else:
            held.append(("user", (key, value)))

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        held = self._held(trial_id)
        if held is None:
            self._call(
                "writing a trial",
                lambda: super(BatchingStorage, self).set_trial_system_attr(trial_id, key, value),
            )
        else:
            held.append(("system", (key, value)))

    def _flush(self, trial_id: int, pending: list[tuple[str, Any]]) -> None:
        """All held writes in one transaction: one lookup of the trial, the parameters, and
        one multi-row upsert per attribute table (per key on engines without upserts)."""
        if not pending:
            return
        backend = self._backend
        attrs: dict[str, dict[str, Any]] = {"user": {}, "system": {}}
        params = []
        for kind, args in pending:
            if kind == "param":
                params.append(args)
            else:
                attrs[kind][args[0]] = args[1]  # the last write of a key wins, as in Optuna
        with self._lock:
            study_id, _ = self._trial_id_to_study_id_and_number[trial_id]
            known = self._studies[study_id].param_distribution
            with _create_scoped_session(backend.scoped_session) as session:
                trial = _rdb_models.TrialModel.find_or_raise_by_id(trial_id, session)
                backend.check_trial_is_updatable(trial_id, trial.state)  # type: ignore[arg-type]
                for name, value, distribution in params:
                    previous = known.get(name)
                    if previous is None:  # first time this study sees it: Optuna's own path
                        backend._set_trial_param_without_commit(
                            session, trial_id, name, value, distribution
                        )
                        continue
                    optuna.distributions.check_distribution_compatibility(previous, distribution)
                    session.add(
                        _rdb_models.TrialParamModel(
                            trial_id=trial_id,
                            param_name=name,
                            param_value=value,
                            distribution_json=optuna.distributions.distribution_to_json(
                                distribution
                            ),
                        )
                    )
                for kind, values in attrs.items():
                    if values:
                        model = (
                            _rdb_models.TrialUserAttributeModel
                            if kind == "user"
                            else _rdb_models.TrialSystemAttributeModel
                        )
                        self._upsert(session, model, trial_id, values)
            for name, _, distribution in params:
                known.setdefault(name, distribution)

    def _upsert(self, session: Any, model: Any, trial_id: int, values: dict[str, Any]) -> None:
        rows = [
            {"trial_id": trial_id, "key": key, "value_json": json.dumps(value)}
            for key, value in values.items()
        ]
        dialect = self._backend.engine.name
        if dialect == "sqlite" and sqlite3.sqlite_version_info >= (3, 24, 0):
            from sqlalchemy.dialects.sqlite import insert
        elif dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert  # type: ignore[assignment]
        else:
            for key, value in values.items():
                self._backend._set_trial_attr_without_commit(session, model, trial_id, key, value)
            return
        stmt = insert(model).values(rows)
        session.execute(
            stmt.on_conflict_do_update(
                index_elements=[model.trial_id, model.key],
                set_={"value_json": stmt.excluded.value_json},
            )
        )


def batching(
    storage: optuna.storages.BaseStorage, *, retry: Retry | None = None
) -> optuna.storages.BaseStorage:
    """``storage`` with :meth:`BatchingStorage.batch` when it is an RDB storage."""
    if _CAN_BATCH and isinstance(storage, optuna.storages.RDBStorage):
        return BatchingStorage(storage, retry=retry)
    return storage


@contextmanager
def batched_writes(study: optuna.Study, trial_id: int) -> Iterator[None]:
    """Writes to ``trial_id`` in the block go to storage in one transaction when the study's
    storage can batch them (:class:`BatchingStorage`), else one by one as usual."""
    storage = study._storage
    if isinstance(storage, BatchingStorage):
        with storage.batch(trial_id):
            yield
    else:
        yield


def load_study(name: str, storage: optuna.storages.BaseStorage) -> optuna.Study:
    """An existing study by name; StorageError listing the studies that do exist."""
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        raise StorageError(
            f"no study named {name!r} in this storage"
            + (f" (studies: {', '.join(names)})" if names else " (it holds no study)")
        ) from None


def create_or_load_study(
    name: str,
    storage: optuna.storages.BaseStorage,
    *,
    directions: list[StudyDirection],
    sampler: optuna.samplers.BaseSampler,
    metric_names: list[str],
) -> optuna.Study:
    """Create the study or resume it; refuses to resume with different directions."""
    try:
        study = optuna.create_study(
            study_name=name,
            storage=storage,
            directions=directions,
            sampler=sampler,
            load_if_exists=True,
        )
    except Exception as exc:
        raise StorageError(
            f"cannot create or load study {name!r}: "
            f"{describe_storage_failure(exc, url=getattr(storage, 'url', None))}"
        ) from None
    if list(study.directions) != list(directions):
        raise StorageError(
            f"study {name!r} exists with directions "
            f"{[d.name.lower() for d in study.directions]}, but the study file asks for "
            f"{[d.name.lower() for d in directions]}; use another --study name"
        )
    if study.metric_names != metric_names:
        study.set_metric_names(metric_names)
    return study
