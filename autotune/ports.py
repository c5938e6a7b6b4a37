"""Local TCP port checks: is a port free, wait until it is, pick free ones.

A server that starts while its predecessor still holds the port dies with "Address already
in use" and the trial is wasted; worse, a health check could be answered by a foreign
process. The launcher therefore waits, bounded, until the port can be bound.

A pick is only a promise: the port stays free until the deployment's server binds it, which
may be seconds (the simulated deployment) or minutes (vLLM) later. Two autotune processes on
one machine (two studies, two workers, the test suite's parallel workers) could hand out the
same port in that window; every pick is therefore claimed in a per-user directory that all of
them read (:func:`claims_dir`), for as long as the picking process lives.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import random
import socket
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def is_port_free(host: str, port: int) -> bool:
    """True when a server could bind ``host:port`` now.

    Binds with ``SO_REUSEADDR`` like the servers do (uvicorn, aiohttp, http.server), so
    connections in TIME_WAIT do not count as "in use"; a listening or bound socket does.
    """
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def wait_port_free(host: str, port: int, *, timeout_s: float, interval_s: float = 0.05) -> bool:
    """Poll until ``host:port`` is free; False when it is still taken after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if is_port_free(host, port):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


_HANDED_OUT: set[tuple[str, int]] = set()
"""Ports this process already picked: a second deployment in the same process (a test, a
benchmark running two sessions) must not get a port the first one's servers are about to bind."""

LOWEST_PICKED = 20_000
"""The lowest port :func:`pick_free_ports` hands out. Below it sit most registered services
(PostgreSQL 5432, the 8000/8080 family, Prometheus 9090, ...) that may start after the pick."""

_PROC_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_PROC_RESERVED = Path("/proc/sys/net/ipv4/ip_local_reserved_ports")


def ephemeral_start() -> int:
    """First port of the range the kernel takes outgoing connections' source ports from.

    Linux says it in ``ip_local_port_range`` (32768 by default); elsewhere 32768 is below
    the range (macOS and Windows start at 49152)."""
    try:
        return int(_PROC_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def reserved_ports() -> set[int]:
    """Ports the administrator reserved (``ip_local_reserved_ports``: "8080,9000-9010")."""
    try:
        text = _PROC_RESERVED.read_text().strip()
    except OSError:
        return set()
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, _, high = part.partition("-")
        with contextlib.suppress(ValueError):
            out.update(range(int(low), int(high or low) + 1))
    return out


CLAIMS_DIR: Path | None = None
"""Where picks are claimed; ``None``: :func:`claims_dir` (a test points it elsewhere)."""

_OWN_CLAIMS: list[Path] = []


def claims_dir() -> Path:
    """The per-user directory of port claims: ``$TMPDIR/autotune-ports-UID``.

    Per user and private (0700): another user's processes cannot plant claims, and a
    directory of the right name that another user owns (or a symlink) is not used."""
    if CLAIMS_DIR is not None:
        return CLAIMS_DIR
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"autotune-ports-{uid}"


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` exists (another user's included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    except OSError:
        return False
    return True


def _private_dir(path: Path) -> bool:
    """Create ``path`` 0700 if missing; True when it is a directory of ours, not a link."""
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    except OSError:  # a read-only or full file system, a file in the way
        return False
    try:
        info = os.lstat(path)
    except OSError:
        return False
    ours = not hasattr(os, "getuid") or info.st_uid == os.getuid()
    return stat.S_ISDIR(info.st_mode) and ours


def _live_claims(where: Path) -> set[int]:
    """The ports live processes other than this one claimed; a dead process's claims are
    removed on the way (called under the lock)."""
    taken: set[int] = set()
    try:
        entries = [e for e in where.iterdir() if e.name.isdigit()]
    except OSError:
        return taken
    for entry in entries:
        try:
            pid = int(entry.read_text().strip() or "0")
        except (OSError, ValueError):
            pid = 0
        if pid == os.getpid():
            continue  # this process's: _HANDED_OUT has them
        if pid and pid_alive(pid):
            taken.add(int(entry.name))
        else:
            with contextlib.suppress(OSError):
                entry.unlink(missing_ok=True)
    return taken


@contextlib.contextmanager
def _claims() -> Iterator[tuple[set[int], list[Path]]]:
    """Under the directory's lock: the ports other live processes claimed, and the list to
    append this pick's claims to (written when the block ends).

    Claims are a courtesy between autotune processes, never a reason to fail a pick: where
    they cannot be kept (no ``fcntl``, an unusable directory, a file that cannot be written)
    picking falls back to the bind check alone."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield set(), []
        return
    where = claims_dir()
    try:
        lock = open(where / ".lock", "a+") if _private_dir(where) else None  # noqa: SIM115
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
    except OSError:
        lock = None
    if lock is None:
        yield set(), []
        return
    with lock:
        new: list[Path] = []
        yield _live_claims(where), new
        for path in new:
            try:
                path.write_text(str(os.getpid()))
            except OSError:
                continue
            _OWN_CLAIMS.append(path)


def release_claims() -> None:
    """Remove this process's claims (at exit; a killed process's are removed by the next
    pick that finds its pid gone). A forked child inherits the list, not the claims: only
    files naming this process are removed."""
    me = str(os.getpid())
    for path in _OWN_CLAIMS:
        with contextlib.suppress(OSError):
            if path.read_text().strip() == me:
                path.unlink()
    _OWN_CLAIMS.clear()


atexit.register(release_claims)


def pick_free_ports(host: str, count: int, *, exclude: set[int] | None = None) -> list[int]:
    """``count`` distinct ports free on ``host`` now, below the ephemeral range.

    Why not bind to port 0: the kernel answers from the ephemeral range, the same range every
    outgoing connection on the machine takes its source port from. Between the pick and the
    server's start (a vLLM start takes minutes) any connection could hold the port, and the
    trial dies with "Address already in use" (seen in this project's own test runs). Below
    the range only an explicit bind takes a port. When that band is too narrow (an
    administrator widened the ephemeral range) or crowded, the kernel chooses after all.

    All sockets stay open until every port is chosen so the same port is not returned
    twice; ``exclude`` are ports already taken by the caller (fixed ports in a file), and no
    port this process picked before, nor one another live autotune process on this machine
    claimed (:func:`claims_dir`), is returned again.
    """
    with _claims() as (claimed, new):
        ports = _pick(host, count, (exclude or set()) | claimed)
        directory = claims_dir()
        new.extend(directory / str(p) for p in ports)
    _HANDED_OUT.update((host, p) for p in ports)
    return ports


def _pick(host: str, count: int, exclude: set[int]) -> list[int]:
    skip = exclude | reserved_ports()
    skip |= {p for h, p in _HANDED_OUT if h == host}
    high = ephemeral_start()
    ports: list[int] = []
    rng = random.Random()
    with contextlib.ExitStack() as stack:
        if high - LOWEST_PICKED >= 1_000:
            for _ in range(50 * count + 200):
                if len(ports) == count:
                    break
                port = rng.randrange(LOWEST_PICKED, high)
                if port in skip or port in ports:
                    continue
                sock = socket.socket(_family(host), socket.SOCK_STREAM)
                try:
                    sock.bind((host, port))
                except OSError as exc:
                    sock.close()
                    if exc.errno == errno.EADDRINUSE:
                        continue
                    raise  # an address of another machine: the caller says so
                stack.enter_context(sock)
                ports.append(port)
        attempts = 0
        while len(ports) < count:
            attempts += 1
            if attempts > count + 100:
                raise OSError(f"could not find {count} free ports on {host}")
            sock = stack.enter_context(socket.socket(_family(host), socket.SOCK_STREAM))
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
            if port in skip or port in ports:
                continue
            ports.append(port)
    return ports


def pick_free_port(host: str = "127.0.0.1") -> int:
    """One port of :func:`pick_free_ports`: for a test rig or a benchmark's server."""
    return pick_free_ports(host, 1)[0]
