"""Serving optuna-dashboard on a study's storage, bound to loopback unless told otherwise.

The dashboard can edit and delete studies, so it listens on 127.0.0.1 by default; reach it
from elsewhere through an SSH tunnel (``ssh -L 8080:127.0.0.1:8080 host``) rather than by
binding a public address. ``--host 0.0.0.0`` (or any address) is honoured when given.
"""

from __future__ import annotations

from pathlib import Path

from autotune.errors import ConfigError, StorageError
from autotune.study.storage import open_storage


def serve_dashboard(
    storage_url: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    artifact_dir: Path | str | None = None,
) -> None:
    """Run optuna-dashboard until interrupted (blocks; Ctrl-C returns normally).

    Raises :class:`StorageError` when the storage cannot be opened (a missing SQLite file
    is refused rather than silently created) and :class:`ConfigError` when the address
    cannot be bound.
    """
    from optuna_dashboard import run_server

    _check_sqlite_exists(storage_url)
    storage = open_storage(storage_url, create=False)  # same timeouts and errors as `run`
    store = None
    if artifact_dir is not None:
        from optuna.artifacts import FileSystemArtifactStore

        directory = Path(artifact_dir)
        directory.mkdir(parents=True, exist_ok=True)
        store = FileSystemArtifactStore(str(directory))
    try:
        run_server(storage, host=host, port=port, artifact_store=store)
    except KeyboardInterrupt:
        return
    except OSError as exc:
        raise ConfigError(
            f"cannot serve the dashboard on {host}:{port}: {exc.strerror or exc}",
            field="port",
        ) from exc


def _check_sqlite_exists(storage_url: str) -> None:
    prefix = "sqlite:///"
    if not storage_url.startswith(prefix):
        return
    path = storage_url[len(prefix) :].split("?", 1)[0]
    if path in ("", ":memory:"):
        raise StorageError(f"{storage_url!r}: an in-memory database holds no study to show")
    if not Path(path).is_file():
        raise StorageError(f"{storage_url!r}: no such database file {path!r}")
