"""A real, throw-away PostgreSQL server for tests (Debian's ``postgresql-15`` binaries).

:class:`PostgresServer` runs ``initdb`` into a fresh temporary directory and starts
``postgres`` on it, listening only on 127.0.0.1 (free port) plus a unix socket inside that
directory, with trust authentication, ``fsync=off`` and small buffers. It can be restarted on
the same data directory and port (connection lost, then back), paused with SIGSTOP (a hung
database: TCP connects hang instead of being refused) and stopped, which removes everything.

``initdb``/``postgres`` refuse to run as root; as root the server runs as the system user
:data:`PG_OS_USER` (created idempotently with ``useradd --system``; ``postgres`` or ``nobody``
when that is impossible). Not as root, it runs as the current user.

Binaries: ``$AUTOTUNE_PG_BINDIR`` if set, else the newest ``/usr/lib/postgresql/*/bin``, else
``initdb`` on ``PATH``. The pytest fixture functions (:func:`pg_server_fixture`,
:func:`pg_url_fixture`) skip when binaries or psycopg2 are missing, unless
``AUTOTUNE_REQUIRE_PG=1`` (CI), which turns that into a failure.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from autotune.ports import pick_free_port as free_port

PG_OS_USER = "autotune-pg"
"""The unprivileged system user the server runs as when the tests run as root."""

PG_ROLE = "autotune"
"""The database superuser role (trust auth: no password)."""

REQUIRE_ENV = "AUTOTUNE_REQUIRE_PG"
BINDIR_ENV = "AUTOTUNE_PG_BINDIR"

_DB_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class PostgresError(RuntimeError):
    """The server could not be initialised, started or stopped."""


# --------------------------------------------------------------------------- discovery


def find_bindir() -> Path | None:
    """The directory with ``initdb``, ``postgres`` (and ``pg_ctl``), or None."""

    def usable(d: Path) -> bool:
        return all(os.access(d / exe, os.X_OK) for exe in ("initdb", "postgres"))

    override = os.environ.get(BINDIR_ENV)
    if override:  # explicit choice: no fallback, so a wrong path shows up as "missing"
        return Path(override) if usable(Path(override)) else None

    def version(d: Path) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", d.parent.name)) or (0,)

    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version, reverse=True)
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).resolve().parent)
    return next((d for d in candidates if usable(d)), None)


def missing_reason() -> str | None:
    """Why a real PostgreSQL server cannot be run here, or None."""
    if find_bindir() is None:
        where = os.environ.get(BINDIR_ENV) or "/usr/lib/postgresql/*/bin or PATH"
        return (
            f"PostgreSQL server binaries (initdb, postgres) not found in {where}: "
            "run scripts/test-deps.sh (installs Debian's postgresql)"
        )
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "psycopg2 is not installed: pip install -e '.[dev]' (psycopg2-binary)"
    return None


def pg_required() -> bool:
    """True when ``AUTOTUNE_REQUIRE_PG`` asks for the PostgreSQL tests to run (CI)."""
    return os.environ.get(REQUIRE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _os_user() -> pwd.struct_passwd | None:
    """The account to run the server as: None means "as the current user" (not root)."""
    if os.geteuid() != 0:
        return None
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(PG_OS_USER)
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    if os.access(useradd, os.X_OK):
        # Exit code 9: created concurrently by another process; fine either way.
        subprocess.run(
            [useradd, "--system", "--user-group", "--no-create-home", "--home-dir",
             "/nonexistent", "--shell", "/usr/sbin/nologin", "--comment",
             "autotune test PostgreSQL", PG_OS_USER],
            capture_output=True, timeout=60, check=False,
        )  # fmt: skip
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(PG_OS_USER)
    for fallback in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(fallback)
    raise PostgresError(f"running as root and could not create or find user {PG_OS_USER!r}")


def _set_parent_death_signal() -> None:  # runs in the child, after setuid
    """Immediate shutdown (SIGQUIT) of the postmaster if the test process dies abruptly."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGQUIT))  # PR_SET_PDEATHSIG


def _descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (children first, then theirs), read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        kids = children.get(todo.pop(0), [])
        found.extend(kids)
        todo.extend(kids)
    return found


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


# --------------------------------------------------------------------------- the server


class PostgresServer:
    """One throw-away PostgreSQL cluster; see the module docstring.

    ``with PostgresServer() as pg: url = pg.url(pg.create_database())``
    """

    def __init__(
        self,
        *,
        base_dir: str | os.PathLike[str] | None = None,
        port: int | None = None,
        max_connections: int = 100,
        start_timeout_s: float = 60.0,
        extra_settings: dict[str, str] | None = None,
    ) -> None:
        self.bindir = find_bindir()
        self._base_parent = Path(base_dir) if base_dir is not None else None
        self.port = port or 0
        self._fixed_port = port is not None
        self.max_connections = max_connections
        self.start_timeout_s = start_timeout_s
        self.extra_settings = dict(extra_settings or {})
        self.user = PG_ROLE
        self.host = "127.0.0.1"
        self.base: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.initdb_seconds: float | None = None
        self.start_seconds: float | None = None
        self._os_user: pwd.struct_passwd | None = None
        self._atexit_registered = False

    # -- paths -----------------------------------------------------------------------------
    @property
    def data_dir(self) -> Path:
        assert self.base is not None, "server not initialised"
        return self.base / "data"

    @property
    def socket_dir(self) -> Path:
        assert self.base is not None, "server not initialised"
        return self.base / "sock"

    @property
    def log_path(self) -> Path:
        assert self.base is not None, "server not initialised"
        return self.base / "postgres.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    # -- urls ------------------------------------------------------------------------------
    def url(self, dbname: str = "postgres") -> str:
        """SQLAlchemy URL, accepted by ``optuna.storages.RDBStorage`` and ``create_study``."""
        return f"postgresql+psycopg2://{self.user}@{self.host}:{self.port}/{dbname}"

    def dsn(self, dbname: str = "postgres", **extra: Any) -> dict[str, Any]:
        """Keyword arguments for ``psycopg2.connect``."""
        return {"host": self.host, "port": self.port, "user": self.user, "dbname": dbname} | extra

    def connect(self, dbname: str = "postgres", *, connect_timeout: int = 5, **extra: Any) -> Any:
        import psycopg2

        return psycopg2.connect(**self.dsn(dbname, connect_timeout=connect_timeout, **extra))

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> PostgresServer:
        """initdb (first time only) and start; returns once it accepts connections."""
        if self.running:
            return self
        if self.bindir is None:
            raise PostgresError(missing_reason() or "PostgreSQL binaries not found")
        if self.base is None:
            self._initdb()
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        attempts = 1 if self._fixed_port else 3
        for attempt in range(attempts):
            if not self._fixed_port and (self.port == 0 or attempt > 0):
                self.port = free_port()
            try:
                self._start_process()
                return self
            except PostgresError as e:
                # Only a lost race for the port is worth another one.
                if attempt + 1 == attempts or "already in use" not in str(e):
                    raise
        return self

    def stop(self) -> None:
        """Fast shutdown (then immediate, then SIGKILL), and remove the temporary directory."""
        self._stop_process()
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None
        if self._atexit_registered:
            atexit.unregister(self.stop)
            self._atexit_registered = False

    def restart(self, *, down_s: float = 0.0) -> None:
        """Stop and start again on the same data directory and port (data preserved)."""
        self._stop_process()
        if down_s:
            time.sleep(down_s)
        self._start_process()

    def pause(self) -> None:
        """SIGSTOP the postmaster and every backend: new connects and open sessions hang."""
        pid = self.pid
        if pid is None:
            raise PostgresError("server not running")
        os.kill(pid, signal.SIGSTOP)  # first, so that it forks nothing new meanwhile
        _signal(_descendants(pid), signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT what :meth:`pause` stopped."""
        pid = self.pid
        if pid is None:
            self.paused = False
            return
        _signal(_descendants(pid), signal.SIGCONT)
        os.kill(pid, signal.SIGCONT)
        self.paused = False

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- databases -------------------------------------------------------------------------
    def create_database(self, name: str | None = None) -> str:
        """Create an empty database (a fresh ``t_<hex>`` name by default); returns the name."""
        name = name or f"t_{uuid.uuid4().hex[:16]}"
        if not _DB_NAME.match(name):
            raise ValueError(f"unsafe database name {name!r}")
        self._admin(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        if not _DB_NAME.match(name):
            raise ValueError(f"unsafe database name {name!r}")
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def terminate_connections(self, dbname: str | None = None) -> int:
        """``pg_terminate_backend`` every client session (of ``dbname``); returns how many."""
        row = self._admin(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend' "
            "AND (%s IS NULL OR datname = %s)",
            (dbname, dbname),
        )
        return int(row[0]) if row else 0

    def _admin(self, sql: str, params: tuple[object, ...] = ()) -> tuple[Any, ...] | None:
        """Run one statement outside a transaction (CREATE/DROP DATABASE need that); its
        first row, if it returns any."""
        conn = self.connect()
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(sql, params or None)
                return cur.fetchone() if cur.description is not None else None
        finally:
            conn.close()

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except (OSError, AssertionError):
            return "(no log)"

    # -- internals -------------------------------------------------------------------------
    def _child_kwargs(self) -> dict[str, Any]:
        assert self.base is not None
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C",
            "LC_ALL": "C",
            "HOME": str(self.base),
            "TZ": os.environ.get("TZ", "UTC"),
        }
        kwargs: dict[str, Any] = {"env": env, "cwd": str(self.base), "stdin": subprocess.DEVNULL}
        if self._os_user is not None:
            kwargs |= {
                "user": self._os_user.pw_uid,
                "group": self._os_user.pw_gid,
                "extra_groups": [],
            }
        return kwargs

    def _initdb(self) -> None:
        assert self.bindir is not None
        self._os_user = _os_user()
        base = Path(tempfile.mkdtemp(prefix="autotune-pg-", dir=self._base_parent))
        self.base = base
        self.socket_dir.mkdir(mode=0o700)
        if self._os_user is not None:
            for path in (base, self.socket_dir):
                os.chown(path, self._os_user.pw_uid, self._os_user.pw_gid)
        t0 = time.monotonic()
        argv = [
            str(self.bindir / "initdb"), "--pgdata", str(self.data_dir), "--username", self.user,
            "--auth", "trust", "--encoding", "UTF8", "--locale", "C", "--no-sync",
        ]  # fmt: skip
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=120, check=False, **self._child_kwargs()
        )
        self.initdb_seconds = time.monotonic() - t0
        if done.returncode != 0:
            shutil.rmtree(base, ignore_errors=True)
            self.base = None
            raise PostgresError(
                f"initdb failed ({done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}"
            )

    def _settings(self) -> dict[str, str]:
        return {
            "listen_addresses": self.host,
            "port": str(self.port),
            "unix_socket_directories": str(self.socket_dir),
            "max_connections": str(self.max_connections),
            "shared_buffers": "16MB",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "logging_collector": "off",
            "log_min_messages": "warning",
            "log_line_prefix": "%m [%p] ",
        } | self.extra_settings

    def _start_process(self) -> None:
        assert self.bindir is not None and self.base is not None
        argv = [str(self.bindir / "postgres"), "-D", str(self.data_dir)]
        for key, value in self._settings().items():
            argv += ["-c", f"{key}={value}"]
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_set_parent_death_signal,
                **self._child_kwargs(),
            )
        self.paused = False
        deadline = t0 + self.start_timeout_s
        while not self._accepting():
            code = self.proc.poll()
            if code is not None or time.monotonic() > deadline:
                if code is None:
                    self._stop_process()
                new_log = self.log_path.read_bytes()[log_start:].decode(errors="replace")
                what = f"exited with {code}" if code is not None else "timed out"
                raise PostgresError(
                    f"postgres on 127.0.0.1:{self.port} {what} after "
                    f"{time.monotonic() - t0:.1f} s; server log tail:\n{new_log[-4000:]}"
                    + ("\n(port already in use)" if "already in use" in new_log else "")
                )
            time.sleep(0.05)
        self.start_seconds = time.monotonic() - t0

    def _accepting(self) -> bool:
        """postmaster.pid says "ready" (as pg_ctl checks) and the TCP port accepts."""
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        if len(lines) < 8 or lines[7].strip() != "ready":
            return False
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(1)
            return s.connect_ex((self.host, self.port)) == 0

    def _stop_process(self, timeout_s: float = 15.0) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            if self.paused:
                self.resume()
            # SIGINT = fast shutdown; SIGQUIT = immediate shutdown; then SIGKILL everything.
            for sig, wait_s in ((signal.SIGINT, timeout_s), (signal.SIGQUIT, 5.0)):
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=wait_s)
                    break
            else:
                _signal([proc.pid, *_descendants(proc.pid)], signal.SIGKILL)
                proc.wait(timeout=10)
        self.proc = None
        self.paused = False


# --------------------------------------------------------------------------- pytest glue


def skip_or_fail_if_missing() -> None:
    """Skip (or, with ``AUTOTUNE_REQUIRE_PG`` set, fail) when no server can be run here."""
    import pytest

    reason = missing_reason()
    if reason is None:
        return
    if pg_required():
        pytest.fail(f"{REQUIRE_ENV} is set but {reason}", pytrace=False)
    pytest.skip(reason)


def pg_server_fixture() -> Iterator[PostgresServer]:
    """Session fixture body: ``pytest.fixture(scope="session", name="pg_server")(this)``."""
    skip_or_fail_if_missing()
    with PostgresServer() as server:
        yield server


def pg_url_fixture(pg_server: PostgresServer) -> Iterator[str]:
    """Per-test fixture body: a SQLAlchemy URL of a fresh, empty database (dropped after).

    Use as ``pytest.fixture(name="pg_url")(this)``. Resumes a paused server and restarts a
    stopped one first, so one test's fault injection cannot break the next.
    """
    if pg_server.paused:
        pg_server.resume()
    if not pg_server.running:
        pg_server.start()
    name = pg_server.create_database()
    yield pg_server.url(name)
    if pg_server.paused:
        pg_server.resume()
    if pg_server.running:
        with contextlib.suppress(Exception):
            pg_server.drop_database(name)
