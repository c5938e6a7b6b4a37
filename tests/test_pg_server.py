"""The real-PostgreSQL test server of ``pg_server``: lifecycle, fault injection, Optuna on it.

Skipped when the PostgreSQL binaries (or psycopg2) are missing, unless AUTOTUNE_REQUIRE_PG=1.
"""

from __future__ import annotations

import os
import pwd
import stat
import threading
import time
from collections.abc import Iterator

import optuna
import pytest
from net_helpers import LOOPBACK_HEX, listeners
from pg_server import (
    BINDIR_ENV,
    PG_OS_USER,
    REQUIRE_ENV,
    PostgresError,
    PostgresServer,
    pg_server_fixture,
    skip_or_fail_if_missing,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def own_server() -> Iterator[PostgresServer]:
    """A server of this module's own, for restart/pause (the session one stays untouched)."""
    skip_or_fail_if_missing()
    with PostgresServer() as server:
        yield server


def _objective(trial: optuna.Trial) -> float:
    x = trial.suggest_float("x", -10, 10)
    return (x - 2) ** 2


def _owner_uid(pid: int) -> int:
    return os.stat(f"/proc/{pid}").st_uid


def test_starts_fast_on_loopback_only_as_an_unprivileged_user(
    pg_server: PostgresServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert pg_server.initdb_seconds is not None and pg_server.start_seconds is not None
    with capsys.disabled():
        print(
            f"\n[pg] initdb {pg_server.initdb_seconds:.2f} s, "
            f"start {pg_server.start_seconds:.2f} s (port {pg_server.port})"
        )
    assert pg_server.initdb_seconds + pg_server.start_seconds < 30
    assert listeners(pg_server.port) == {LOOPBACK_HEX}
    assert pg_server.pid is not None
    uid = _owner_uid(pg_server.pid)
    if os.geteuid() == 0:
        assert uid == pwd.getpwnam(PG_OS_USER).pw_uid != 0
    else:
        assert uid == os.geteuid()
    assert stat.S_IMODE(pg_server.data_dir.stat().st_mode) == 0o700
    assert (pg_server.socket_dir / f".s.PGSQL.{pg_server.port}").exists()


def test_optuna_study_in_one_of_two_fresh_databases(pg_server: PostgresServer, pg_url: str) -> None:
    other = pg_server.create_database()
    storage = optuna.storages.RDBStorage(pg_url)  # the URL form Optuna accepts
    assert storage.engine.dialect.name == "postgresql"
    assert storage.engine.dialect.driver == "psycopg2"

    study = optuna.create_study(study_name="s", storage=pg_url)
    study.optimize(_objective, n_trials=5)

    assert len(optuna.load_study(study_name="s", storage=pg_url).trials) == 5
    assert optuna.get_all_study_names(storage=pg_server.url(other)) == []
    pg_server.drop_database(other)


def test_restart_keeps_the_study_and_port(own_server: PostgresServer) -> None:
    url = own_server.url(own_server.create_database())
    study = optuna.create_study(study_name="r", storage=url)
    study.optimize(_objective, n_trials=5)
    before = [(t.number, t.state, t.value, t.params) for t in study.trials]
    pinged = optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})
    assert len(pinged.get_all_trials(pinged.get_study_id_from_name("r"))) == 5
    port, data_dir, pid = own_server.port, own_server.data_dir, own_server.pid

    own_server.restart()

    assert (own_server.port, own_server.data_dir) == (port, data_dir)
    assert own_server.pid != pid
    reloaded = optuna.load_study(study_name="r", storage=url)
    assert [(t.number, t.state, t.value, t.params) for t in reloaded.trials] == before
    # A pooled engine with pool_pre_ping survives the restart transparently.
    assert len(pinged.get_all_trials(pinged.get_study_id_from_name("r"))) == 5
    reloaded.optimize(_objective, n_trials=1)
    assert len(optuna.load_study(study_name="r", storage=url).trials) == 6


def test_pause_hangs_connections_and_resume_releases_them(own_server: PostgresServer) -> None:
    import psycopg2

    dbname = own_server.create_database()
    open_conn = own_server.connect(dbname)
    try:
        own_server.pause()
        try:
            t0 = time.monotonic()
            with pytest.raises(psycopg2.OperationalError):
                own_server.connect(dbname, connect_timeout=2).close()
            assert 1.5 < time.monotonic() - t0 < 15  # timed out, was not refused
            # A query on an open session hangs (the kernel still ACKs) instead of failing.
            result: list[object] = []

            def query() -> None:
                with open_conn.cursor() as cur:
                    cur.execute("SELECT 41 + 1")
                    result.append(cur.fetchone())

            worker = threading.Thread(target=query, daemon=True)
            worker.start()
            worker.join(1.0)
            assert worker.is_alive() and result == []
        finally:
            own_server.resume()
        worker.join(10)
        assert result == [(42,)]
        fresh = own_server.connect(dbname, connect_timeout=2)
        fresh.close()
    finally:
        open_conn.close()


def test_stop_removes_the_data_dir_and_frees_the_port() -> None:
    skip_or_fail_if_missing()
    server = PostgresServer().start()
    base, port, pid = server.base, server.port, server.pid
    assert base is not None and base.is_dir() and pid is not None
    server.create_database("x")
    server.pause()  # stopping a paused server must work too
    server.stop()
    assert not base.exists()
    assert listeners(port) == set()
    assert not os.path.exists(f"/proc/{pid}")
    assert server.pid is None and server.base is None
    server.stop()  # idempotent


def test_a_startup_failure_says_why_with_the_log_tail(own_server: PostgresServer) -> None:
    clash = PostgresServer(port=own_server.port, start_timeout_s=20)
    try:
        with pytest.raises(PostgresError) as err:
            clash.start()
    finally:
        clash.stop()
    text = str(err.value)
    assert f"127.0.0.1:{own_server.port}" in text and "server log tail" in text
    assert "already in use" in text
    assert own_server.connect().close() is None  # the original is unharmed


def test_fixture_skips_without_binaries_unless_required(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.setenv(BINDIR_ENV, str(tmp_path))  # a directory without initdb/postgres
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="initdb, postgres"):
        next(pg_server_fixture())
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=f"{REQUIRE_ENV} is set"):
        next(pg_server_fixture())
    monkeypatch.setenv(REQUIRE_ENV, "0")
    with pytest.raises(pytest.skip.Exception):
        next(pg_server_fixture())
