"""Shells on remote hosts over SSH (fabric/paramiko), and the pool that owns them.

One fabric ``Connection`` per host is opened lazily and reused for every command and trial
(service restarts are many small commands; a handshake each would dominate). The rules:

* Host keys come from the host's ``known_hosts`` file only (no ``~/.ssh/config`` or system
  files are read, so what the deployment says is what happens). An unknown key is refused
  unless the host opts in with ``accept_new_host_key``, which then appends it to
  ``known_hosts``. A *changed* key is always refused, opt-in or not.
* A connection found dead before a command (idle drop, sshd restart) is reopened
  silently; one that fails while a command is being started is reopened once and the
  command retried. A connection lost *while a command runs* is an error, not a retry: the
  command may have run, and running e.g. a service start twice is worse than a failed
  trial.
* Authentication is by key file or agent only. Private keys are read by paramiko alone;
  their contents never reach a message, a log line or an attribute of these classes.


This module holds the pool and is the one to import from; its private siblings split one SSH
connection's life by concept: the host-key rules (:mod:`autotune.remote._ssh_host_keys`: the
known_hosts policy, :class:`HostKeyError`), the connection pieces below a shell
(:mod:`autotune.remote._ssh_connection`: the fabric connection that opens once, the watchdog,
what counts as a dropped connection) and the shell itself (:mod:`autotune.remote._ssh_shell`:
connect, exec, atomic upload, reconnect, sharing the connection state and its lock). The
shell contract it implements is :mod:`autotune.remote.shell`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType

from autotune.errors import ConfigError
from autotune.hosts import HostSpec, validate_hosts
from autotune.remote._ssh_connection import WATCHDOG_GRACE_S
from autotune.remote._ssh_host_keys import HostKeyError
from autotune.remote._ssh_shell import SSHShell

__all__ = ["WATCHDOG_GRACE_S", "HostKeyError", "HostPool", "SSHShell", "host_pool"]


class HostPool:
    """The shells of a deployment's hosts, connected lazily and closed together.

    Jump hosts share the pool's shell of the gateway host, so a gateway is connected once
    however many hosts sit behind it.
    """

    def __init__(self, hosts: Mapping[str, HostSpec], *, file: str = "hosts") -> None:
        validate_hosts(hosts, file=file)
        self._hosts = dict(hosts)
        self._file = file
        self._shells: dict[str, SSHShell] = {}
        self._lock = threading.RLock()

    @property
    def names(self) -> list[str]:
        return sorted(self._hosts)

    def spec(self, name: str) -> HostSpec:
        return self._hosts[self._check(name)]

    def _check(self, name: str) -> str:
        if name not in self._hosts:
            raise ConfigError(
                f"unknown host {name!r}", file=self._file, field="host", allowed=self.names
            )
        return name

    def get(self, name: str) -> SSHShell:
        """The shell of host ``name`` (not connected until first used)."""
        with self._lock:
            shell = self._shells.get(self._check(name))
            if shell is None:
                spec = self._hosts[name]
                gateway = self.get(spec.jump) if spec.jump is not None else None
                shell = SSHShell(name, spec, gateway=gateway)
                self._shells[name] = shell
            return shell

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def close_all(self) -> None:
        """Close every connection, hosts behind a jump host before the jump host."""
        with self._lock:
            shells = list(self._shells.values())
            self._shells.clear()
        for shell in reversed(shells):  # a gateway is always created before its users
            shell.close()

    def __enter__(self) -> HostPool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close_all()


@contextmanager
def host_pool(hosts: Mapping[str, HostSpec], *, file: str = "hosts") -> Iterator[HostPool]:
    """``with host_pool(hosts) as pool:`` convenience."""
    pool = HostPool(hosts, file=file)
    try:
        yield pool
    finally:
        pool.close_all()
