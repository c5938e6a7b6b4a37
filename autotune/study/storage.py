"""Opening the study storage: SQLite by default, any SQLAlchemy URL Optuna accepts.

Kept apart from the loop so every command (run, best, report, dashboard) resolves the
same default and gives the same clear error for a bad URL or an unreadable file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
    elif path is None and url.startswith(("postgresql", "mysql")):
        # A database server that does not answer must not hang the tuner: bounded connect,
        # and a pooled connection the server dropped is replaced, not used.
        engine_kwargs = {"pool_pre_ping": True}
        if "connect_timeout=" not in url:
            engine_kwargs["connect_args"] = {"connect_timeout": SERVER_CONNECT_TIMEOUT_S}
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
    except Exception as exc:  # SQLAlchemy raises many types; the user needs one message.
        raise StorageError(
            f"cannot open storage {display_url(url)}: {describe_storage_failure(exc, url=url)}"
        ) from None


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
