"""Host-key rules of the SSH shells: what ``known_hosts`` allows, and the error when it refuses.

An unknown key is refused unless the host opts in with ``accept_new_host_key`` (then it is
appended to ``known_hosts``); an ``@revoked`` key is always refused. Held apart from the shell
(:mod:`autotune.remote._ssh_shell`, which loads ``known_hosts`` and turns these refusals into
:class:`HostKeyError`) so that the policy reads in one place; import the public names from
:mod:`autotune.remote.ssh`.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import paramiko

from autotune.hosts import HostSpec
from autotune.remote.shell import ShellError

# The public module's name, as before the split: one logger for every SSH record.
log = logging.getLogger("autotune.remote.ssh")


class HostKeyError(ShellError):
    """The host's key is unknown (and not opted in) or has changed. Never retried."""


class _UnknownHostKey(Exception):
    """Raised inside paramiko's handshake; turned into :class:`HostKeyError`."""

    def __init__(self, key: paramiko.PKey) -> None:
        super().__init__("unknown host key")
        self.key = key


class _RevokedHostKey(_UnknownHostKey):
    """The server's key is marked ``@revoked`` in known_hosts."""


class _KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """Reject unknown keys, or (opt-in) append them to ``known_hosts`` and go on."""

    def __init__(self, spec: HostSpec, host: str, revoked: set[tuple[str, str]]) -> None:
        self._spec = spec
        self._host = host
        self._revoked = revoked

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: Any) -> None:
        if (key.get_name(), key.get_base64()) in self._revoked:
            raise _RevokedHostKey(key)
        if not self._spec.accept_new_host_key:
            raise _UnknownHostKey(key)
        path = self._spec.known_hosts_path
        _append_known_host(path, hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)
        log.warning(
            "%s: accepted new host key of %s (%s %s) and saved it to %s",
            self._host,
            self._spec.endpoint,
            key.get_name(),
            key.fingerprint,
            path,
        )


def _append_known_host(path: str, hostname: str, key: Any) -> None:
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a", encoding="ascii") as fh:
        if fh.tell() > 0:
            with open(path, "rb") as check:
                check.seek(-1, os.SEEK_END)
                if check.read(1) != b"\n":
                    fh.write("\n")
        fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


def _known_hosts_name(spec: HostSpec) -> str:
    return spec.address if spec.port == 22 else f"[{spec.address}]:{spec.port}"
