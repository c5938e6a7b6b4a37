"""Opening the study storage: SQLite by default, any SQLAlchemy URL Optuna accepts.

Kept apart from the loop so every command (run, best, report, dashboard) resolves the
same default and gives the same clear error for a bad URL or an unreadable file.
"""

from __future__ import annotations

import os
import random
import re
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol, TypeVar

import optuna
import sqlalchemy.exc
from optuna.study import StudyDirection
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
    if rest.startswith("file:"):  # an SQLite URI filename (``?...&uri=true``)
        rest = rest[len("file:") :]
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


SQLITE_DRIVER_ARGS = (
    "timeout", "isolation_level", "detect_types", "check_same_thread", "cached_statements", "uri",
)  # fmt: skip
"""What SQLAlchemy's pysqlite dialect reads from an SQLite URL's query string; the rest are
SQLite URI parameters (``mode``, ``cache``, ...), read only with ``uri=true``."""


def _check_sqlite_query(url: str) -> None:
    """An SQLite URL's query must be read by the driver: SQLAlchemy only warns of the rest
    and drops it, so ``?mode=ro`` would open the database read-write, which is not what the
    user asked for."""
    if url.partition("://")[0] not in ("sqlite", "sqlite+pysqlite") or "?" not in url:
        return
    query = urllib.parse.parse_qs(url.split("?", 1)[1], keep_blank_values=True)
    if query.get("uri", [""])[-1].strip().lower() in ("true", "1", "yes", "on"):
        return  # SQLite's own URI parameters, passed on by the driver
    ignored = sorted(set(query) - set(SQLITE_DRIVER_ARGS))
    if ignored:
        raise StorageError(
            f"storage {display_url(url)}: SQLite's driver does not read "
            f"{', '.join(repr(k) for k in ignored)} (its query arguments are "
            f"{', '.join(SQLITE_DRIVER_ARGS)}; SQLite URI parameters such as mode need "
            "uri=true as well: sqlite:///file:study.db?mode=ro&uri=true)"
        )


def open_storage(url: str, *, create: bool) -> optuna.storages.BaseStorage:
    """An Optuna RDB storage for ``url``; StorageError with the reason when it cannot open."""
    _check_sqlite_query(url)
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


def has_trials(url: str, name: str) -> bool:
    """Study ``name`` exists in ``url`` and holds a trial; False when the database (an SQLite
    file not created yet) or the study does not exist. Creates nothing in SQLite."""
    path = _sqlite_path(url)
    if path is not None and not path.exists():
        return False
    storage = open_storage(url, create=False)
    with storage_errors(url, f"reading study {name!r}"):
        try:
            study_id = storage.get_study_id_from_name(name)
        except KeyError:
            return False
        return storage.get_n_trials(study_id) > 0


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


# The batching wrapper subclasses Optuna's private cached storage: it lives with the other
# Optuna internals (autotune/study/_optuna_compat.py) and is used from here.
from autotune.study._optuna_compat import BatchingStorage as BatchingStorage  # noqa: E402
from autotune.study._optuna_compat import batched_writes as batched_writes  # noqa: E402
from autotune.study._optuna_compat import batching as batching  # noqa: E402
