"""The SSH shell: a :class:`~autotune.remote.shell.Shell` on one host over one reused connection.

One connection's life in one class, because every step shares the connection state and its
lock: connect (host-key policy from :mod:`autotune.remote._ssh_host_keys`, a jump host as
gateway), exec with a watchdog, atomic upload, and reconnecting when the connection dropped
(the pieces in :mod:`autotune.remote._ssh_connection`). The pool that owns the shells is
:class:`autotune.remote.ssh.HostPool`; import :class:`SSHShell` from :mod:`autotune.remote.ssh`.
"""

from __future__ import annotations

import logging
import os
import posixpath
import secrets
import shlex
import socket
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar

import paramiko
from invoke.exceptions import CommandTimedOut, ThreadException

from autotune.hosts import HostSpec
from autotune.remote._ssh_connection import (
    _NO_EXIT_STATUS,
    WATCHDOG_GRACE_S,
    _brief,
    _close_quietly,
    _Connection,
    _exc_text,
    _fabric_config,
    _is_drop,
    _NoAnswer,
    _watchdog,
)
from autotune.remote._ssh_host_keys import (
    HostKeyError,
    _known_hosts_name,
    _KnownHostsPolicy,
    _RevokedHostKey,
    _UnknownHostKey,
)
from autotune.remote.shell import CommandResult, Shell, ShellError

# The public module's name, as before the split: one logger for every SSH record.
log = logging.getLogger("autotune.remote.ssh")

T = TypeVar("T")


class SSHShell(Shell):
    """A :class:`Shell` on one host over one reused SSH connection.

    ``gateway`` is the shell of the host's ``jump`` host; its connection carries this one
    (ProxyJump). Nothing connects until the first command (or :meth:`connect`).
    """

    def __init__(self, name: str, spec: HostSpec, *, gateway: SSHShell | None = None) -> None:
        self.name = name
        self.spec = spec
        self._gateway = gateway
        self._conn: Any = None  # fabric.Connection (untyped library)
        self._lock = threading.RLock()
        self._sftp_lock = threading.Lock()
        #: How many SSH connections this shell has opened (1 while nothing dropped).
        self.connections_opened = 0

    def __repr__(self) -> str:
        return f"SSHShell({self.name!r}, {self.spec.login_user}@{self.spec.endpoint})"

    # ------------------------------------------------------------------ connection
    @property
    def is_connected(self) -> bool:
        conn = self._conn
        return bool(conn is not None and conn.is_connected)

    @property
    def transport(self) -> paramiko.Transport | None:
        """The live paramiko transport, if connected (diagnostics and tests)."""
        conn = self._conn
        return conn.transport if conn is not None and conn.is_connected else None

    def connect(self) -> None:
        """Connect now: verifies the host key and authenticates (raises ShellError)."""
        self.connection()

    def connection(self) -> Any:
        """The open fabric ``Connection``, (re)opened if it is not alive."""
        with self._lock:
            conn = self._conn
            if conn is not None and conn.is_connected:
                return conn
            if conn is not None:
                self._conn = None
                _close_quietly(conn)
            self._conn = self._open()
            return self._conn

    def _open(self) -> Any:
        spec = self.spec
        key = spec.key_path
        if key is not None and not os.path.isfile(key):
            raise ShellError(self.name, f"key_file {key} does not exist")
        gateway = self._gateway.connection() if self._gateway is not None else None
        connect_kwargs: dict[str, Any] = {
            "timeout": spec.connect_timeout_s,
            "banner_timeout": spec.connect_timeout_s,
            "auth_timeout": spec.connect_timeout_s,
            "channel_timeout": spec.connect_timeout_s,
            "allow_agent": True,
            "look_for_keys": key is None,
        }
        if key is not None:
            connect_kwargs["key_filename"] = key
        conn = _Connection(
            host=spec.address,
            port=spec.port,
            user=spec.login_user,
            config=_fabric_config(),
            gateway=gateway if gateway is not None else False,
            connect_kwargs=connect_kwargs,
        )
        client = conn.client
        revoked = self._load_known_hosts(client)
        client.set_missing_host_key_policy(_KnownHostsPolicy(spec, self.name, revoked))
        try:
            conn.open()
            offered = conn.transport.get_remote_server_key()
            if (offered.get_name(), offered.get_base64()) in revoked:
                raise _RevokedHostKey(offered)
        except Exception as exc:
            # The transport may be up with an unverified key: never leave it usable.
            client.close()
            conn.transport = None
            raise self._connect_error(exc) from None
        except BaseException:
            client.close()
            raise
        conn.transport.set_keepalive(30)
        self.connections_opened += 1
        via = f" via {self._gateway.name}" if self._gateway is not None else ""
        log.info("%s: connected to %s@%s%s", self.name, spec.login_user, spec.endpoint, via)
        return conn

    def _load_known_hosts(self, client: paramiko.SSHClient) -> set[tuple[str, str]]:
        """Load known_hosts like OpenSSH: unreadable lines are skipped, not fatal. Returns
        the ``@revoked`` keys (type, base64), which are refused whatever else says."""
        path = self.spec.known_hosts_path
        revoked: set[tuple[str, str]] = set()
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                lines = fh.read().splitlines()
        except FileNotFoundError:
            return revoked
        except OSError as exc:
            reason = f"cannot read known_hosts {path}: {_exc_text(exc)}"
            raise ShellError(self.name, reason) from None
        keys = client.get_host_keys()
        for lineno, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("@revoked"):
                fields = line.split()
                if len(fields) >= 4:
                    revoked.add((fields[2], fields[3]))
                continue
            if line.startswith("@"):  # @cert-authority: host certificates are not supported
                continue
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
            except Exception:
                log.debug("%s: skipping unreadable line %d of %s", self.name, lineno, path)
                continue
            if entry is not None:
                for hostname in entry.hostnames:
                    keys.add(hostname, entry.key.get_name(), entry.key)
        return revoked

    def _connect_error(self, exc: Exception) -> ShellError:
        spec = self.spec
        where = f"{spec.login_user}@{spec.endpoint}"
        if self._gateway is not None:
            where += f" (via jump host {self._gateway.name})"
        if isinstance(exc, _RevokedHostKey):
            return HostKeyError(
                self.name,
                f"host key of {spec.endpoint} ({exc.key.get_name()} {exc.key.fingerprint}) is "
                f"marked @revoked in {spec.known_hosts_path}; refusing to connect",
            )
        if isinstance(exc, _UnknownHostKey):
            return HostKeyError(
                self.name,
                f"host key of {spec.endpoint} is not in {spec.known_hosts_path} "
                f"(server offered {exc.key.get_name()} {exc.key.fingerprint}); connect once "
                "with ssh-keyscan/ssh or set accept_new_host_key: true",
            )
        if isinstance(exc, paramiko.BadHostKeyException):
            return HostKeyError(
                self.name,
                f"host key of {spec.endpoint} has CHANGED: {spec.known_hosts_path} has "
                f"{exc.expected_key.get_name()} {exc.expected_key.fingerprint}, the server "
                f"offered {exc.key.get_name()} {exc.key.fingerprint}. Refusing to connect "
                "(possible man-in-the-middle; accept_new_host_key never overrides a changed "
                "key). If the host was legitimately reinstalled, remove the old entry with: "
                f"ssh-keygen -R '{_known_hosts_name(spec)}' -f {spec.known_hosts_path}",
            )
        if isinstance(exc, paramiko.PasswordRequiredException):
            return ShellError(
                self.name,
                f"key_file {spec.key_path} is encrypted; load it into an SSH agent (ssh-add) "
                "and leave key_file unset",
            )
        if isinstance(exc, paramiko.AuthenticationException):
            using = f"key_file {spec.key_path}" if spec.key_path else "the SSH agent/default keys"
            return ShellError(self.name, f"authentication failed for {where} using {using}")
        if isinstance(exc, paramiko.ChannelException) and self._gateway is not None:
            return ShellError(
                self.name,
                f"jump host {self._gateway.name} could not reach {spec.endpoint}: "
                f"{getattr(exc, 'text', exc)}",
            )
        if isinstance(exc, (socket.timeout, TimeoutError)):
            return ShellError(
                self.name, f"timed out connecting to {where} after {spec.connect_timeout_s:g}s"
            )
        if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
            reasons = {_exc_text(e) for e in exc.errors.values()}
            return ShellError(self.name, f"cannot connect to {where}: {'; '.join(sorted(reasons))}")
        return ShellError(self.name, f"cannot connect to {where}: {_exc_text(exc)}")

    def _call(self, what: str, fn: Callable[[Any], T]) -> T:
        """Run ``fn(connection)``; reopen once and retry when the connection was dropped."""
        for attempt in (1, 2):
            conn = self.connection()
            try:
                return fn(conn)
            except (paramiko.SSHException, EOFError, OSError) as exc:
                if "timeout opening channel" in str(exc).lower():
                    self._discard(conn)  # the host is up but does not answer
                    raise ShellError(
                        self.name,
                        f"no answer from the host within {self.spec.connect_timeout_s:g}s "
                        f"(opening a channel for {what}); connection closed, not retried",
                    ) from None
                if not _is_drop(exc, conn):
                    raise ShellError(self.name, f"{what} failed: {_exc_text(exc)}") from None
                self._discard(conn)
                if attempt == 2:
                    raise ShellError(
                        self.name, f"connection lost again after reconnecting: {_exc_text(exc)}"
                    ) from None
                log.info("%s: connection dropped (%s); reconnecting", self.name, _exc_text(exc))
        raise AssertionError("unreachable")

    def _discard(self, conn: Any) -> None:
        with self._lock:
            if self._conn is conn:
                self._conn = None
        _close_quietly(conn)

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            _close_quietly(conn)

    # ------------------------------------------------------------------ commands
    def command_line(self, command: str, *, sudo: bool = False) -> str:
        """The exact line sent to the host: POSIX ``sh -c``, under ``sudo -n`` when the host's
        sudo policy says so for a privileged command."""
        line = f"sh -c {shlex.quote(command)}"
        return f"sudo -n {line}" if self.spec.needs_sudo(sudo) else line

    def run(
        self, command: str, *, timeout_s: float | None = None, sudo: bool = False
    ) -> CommandResult:
        """Run ``command``; ``timeout_s`` defaults to the host's ``command_timeout_s``."""
        timeout = self.spec.command_timeout_s if timeout_s is None else timeout_s
        line = self.command_line(command, sudo=sudo)

        def go(conn: Any) -> CommandResult:
            started = time.monotonic()
            try:
                with _watchdog(conn, timeout + WATCHDOG_GRACE_S) as fired:
                    try:
                        res = conn.run(
                            line,
                            warn=True,
                            hide=True,
                            in_stream=False,
                            pty=False,
                            timeout=timeout,
                            encoding="utf-8",
                        )
                    finally:
                        if fired.is_set():
                            self._discard(conn)
                            raise _NoAnswer(timeout)
            except _NoAnswer:
                raise ShellError(
                    self.name,
                    f"no answer from the host within {timeout:g}s; connection closed, "
                    f"not retried: {_brief(command)}",
                ) from None
            except CommandTimedOut:
                raise ShellError(
                    self.name, f"command timed out after {timeout:g}s: {_brief(command)}"
                ) from None
            except ThreadException as exc:
                self._discard(conn)
                raise ShellError(
                    self.name, f"connection failed while the command ran ({exc}); not retried"
                ) from None
            if res.exited != 0 and time.monotonic() - started >= timeout:
                # invoke's timer killed it but, racing the channel's end on a busy machine,
                # returned the result instead of raising CommandTimedOut (warn=True).
                raise ShellError(
                    self.name, f"command timed out after {timeout:g}s: {_brief(command)}"
                )
            if res.exited == _NO_EXIT_STATUS and not conn.is_connected:
                self._discard(conn)
                raise ShellError(
                    self.name,
                    "connection lost while the command was running (it may have partly run; "
                    f"not retried): {_brief(command)}",
                )
            return CommandResult(int(res.exited), res.stdout, res.stderr)

        return self._call("command", go)

    # ------------------------------------------------------------------ files
    def put_text(self, path: str, text: str, *, mode: int = 0o644, sudo: bool = False) -> None:
        """Write ``text`` atomically: upload to a temporary file (same directory, or ``/tmp``
        then ``sudo install`` when privileged), set ``mode``, rename over ``path``. The
        temporary file is removed on every failure."""
        if not path.startswith("/") or path.endswith("/"):
            raise ShellError(self.name, f"put_text needs an absolute file path, got {path!r}")
        path = posixpath.normpath(path)
        directory, name = posixpath.split(path)
        data = text.encode("utf-8")
        token = secrets.token_hex(8)
        if self.spec.needs_sudo(sudo):
            stage = f"/tmp/.autotune-put-{token}"
            self._upload(stage, data, 0o600)
            try:
                tmp = f"{directory}/.{name}.autotune-{token}"
                self._install(path, directory, tmp, mode, source=stage, sudo=True)
            finally:
                self._remove_quietly(stage)
        else:
            self._mkdir(directory)
            tmp = f"{directory}/.{name}.autotune-{token}"
            self._upload(tmp, data, mode)
            self._install(path, directory, tmp, mode, source=None, sudo=False)

    def _mkdir(self, directory: str) -> None:
        res = self.run(f"mkdir -p {shlex.quote(directory)}")
        if not res.ok:
            raise ShellError(self.name, f"cannot create {directory}: {res.stderr.strip()}")

    def _install(
        self, path: str, directory: str, tmp: str, mode: int, *, source: str | None, sudo: bool
    ) -> None:
        q = shlex.quote
        steps = ["set -e"]
        if source is not None:
            steps.append(f"mkdir -p {q(directory)}")
        steps += [
            f"trap 'rm -f {q(tmp)}' EXIT",
            f"if [ -d {q(path)} ]; then echo {q(path + ' is a directory')} >&2; exit 1; fi",
        ]
        if source is not None:
            steps.append(f"install -m {mode:o} {q(source)} {q(tmp)}")
        steps.append(f"mv -f {q(tmp)} {q(path)}")
        try:
            res = self.run("\n".join(steps), sudo=sudo)
        except ShellError:
            if source is None:
                self._remove_quietly(tmp)
            raise
        if not res.ok:
            raise ShellError(self.name, f"cannot write {path}: {res.stderr.strip()}")

    def _upload(self, remote: str, data: bytes, mode: int) -> None:
        limit = self.spec.command_timeout_s

        def go(conn: Any) -> None:
            with self._sftp_lock, _watchdog(conn, limit) as fired:
                try:
                    sftp = conn.sftp()
                    sftp.get_channel().settimeout(limit)
                    with suppress(OSError):
                        sftp.remove(remote)  # a partial file from an attempt that dropped
                    try:
                        # 'x': O_EXCL, never follows a planted symlink; mode set first.
                        with sftp.open(remote, "wx") as fh:
                            fh.chmod(mode)
                            fh.write(data)
                    except BaseException:
                        if conn.is_connected and not fired.is_set():
                            with suppress(OSError):
                                sftp.remove(remote)
                        raise
                finally:
                    if fired.is_set():
                        self._discard(conn)
                        raise ShellError(
                            self.name,
                            f"no answer from the host within {limit:g}s while writing "
                            f"{remote}; connection closed, not retried",
                        )

        self._call(f"writing {remote}", go)

    def _remove_quietly(self, remote: str) -> None:
        try:
            conn = self.connection()
            with self._sftp_lock, _watchdog(conn, self.spec.command_timeout_s) as fired:
                try:
                    conn.sftp().remove(remote)
                finally:
                    if fired.is_set():
                        self._discard(conn)
        except Exception:  # best effort: the file may be gone, or the host unreachable
            log.debug("%s: could not remove %s", self.name, remote)
