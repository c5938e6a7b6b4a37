"""Opening the study storage: SQLite by default, any SQLAlchemy URL Optuna accepts.

Kept apart from the loop so every command (run, best, report, dashboard) resolves the
same default and gives the same clear error for a bad URL or an unreadable file.
"""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.study import StudyDirection

from autotune.errors import StorageError

STUDIES_DIR = Path("studies")


def default_storage_url(study_name: str, *, studies_dir: Path = STUDIES_DIR) -> str:
    """``sqlite:///studies/NAME.db`` (relative to the working directory)."""
    return f"sqlite:///{studies_dir / (study_name + '.db')}"


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
    try:
        engine_kwargs = {"connect_args": {"timeout": 30}} if path is not None else {}
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
    except Exception as exc:  # SQLAlchemy raises many types; the user needs one message.
        raise StorageError(f"cannot open storage {url!r}: {exc}") from None


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
        raise StorageError(f"cannot create or load study {name!r}: {exc}") from None
    if list(study.directions) != list(directions):
        raise StorageError(
            f"study {name!r} exists with directions "
            f"{[d.name.lower() for d in study.directions]}, but the study file asks for "
            f"{[d.name.lower() for d in directions]}; use another --study name"
        )
    if study.metric_names != metric_names:
        study.set_metric_names(metric_names)
    return study
