"""An SQLite URL's query string: what the driver does not read is refused, not dropped.

SQLAlchemy's pysqlite dialect reads six arguments from the query (``timeout``, ...) and, for
the rest, only warns and drops them unless the URL says ``uri=true``: ``?mode=ro`` would open
the study read-write. autotune refuses such a URL before touching the file, naming the
arguments and the form SQLite URI parameters need; with ``uri=true`` they reach SQLite.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from autotune.errors import StorageError
from autotune.study.storage import SQLITE_DRIVER_ARGS, has_trials, open_storage


@pytest.fixture
def study_db(tmp_path: Path) -> Path:
    db = tmp_path / "s.db"
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{db}")
    study.add_trial(optuna.trial.create_trial(value=1.0))
    return db


def test_an_argument_the_driver_drops_is_refused_and_nothing_is_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StorageError, match="does not read 'mode'"):
        open_storage("sqlite+pysqlite:///new.db?mode=ro", create=True)
    with pytest.raises(StorageError) as err:
        open_storage("sqlite:///new.db?mode=ro&cache=shared", create=True)
    text = str(err.value)
    assert "does not read 'cache', 'mode'" in text
    assert all(arg in text for arg in SQLITE_DRIVER_ARGS)
    assert "uri=true" in text
    assert not (tmp_path / "new.db").exists()


def test_the_drivers_own_arguments_pass(study_db: Path) -> None:
    storage = open_storage(f"sqlite:///{study_db}?timeout=5", create=False)
    assert [s.study_name for s in storage.get_all_studies()] == ["s"]


def test_with_uri_true_sqlite_reads_them_read_only_really_is(study_db: Path) -> None:
    url = f"sqlite:///file:{study_db}?mode=ro&uri=true"
    assert has_trials(url, "s")
    storage = open_storage(url, create=False)
    study = optuna.load_study(study_name="s", storage=storage)
    assert [t.value for t in study.trials] == [1.0]
    with pytest.raises(Exception) as refused:
        study.add_trial(optuna.trial.create_trial(value=2.0))
    causes: list[str] = []
    exc: BaseException | None = refused.value  # Optuna wraps SQLite's refusal
    while exc is not None:
        causes.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    assert any("readonly" in c for c in causes), causes
    with sqlite3.connect(study_db) as conn:  # nothing written
        assert conn.execute("select count(*) from trials").fetchone() == (1,)
    with pytest.raises(StorageError, match="no study database at"):
        open_storage(f"sqlite:///file:{study_db.parent / 'none.db'}?mode=ro&uri=true", create=False)


def test_the_cli_says_so_and_exits_without_a_traceback(study_db: Path, tmp_path: Path) -> None:
    before = study_db.read_bytes()
    copy = tmp_path / "copy.db"
    shutil.copy(study_db, copy)
    out = subprocess.run(
        [sys.executable, "-m", "autotune", "best", "--study", "s", "--storage",
         f"sqlite:///{copy}?mode=ro"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode != 0
    assert "does not read 'mode'" in out.stderr and "Traceback" not in out.stderr
    assert copy.read_bytes() == before
