"""The pieces below an SSH shell: its fabric connection, the watchdog, dropped connections.

A fabric ``Connection`` that opens once (:class:`_Connection`) with no ssh_config read
(:func:`_fabric_config`), a watchdog that closes a connection whose host stopped answering
(:func:`_watchdog`), what counts as a dropped connection (:func:`_is_drop`) and the short
texts messages quote. Stateless helpers, held apart from :class:`~autotune.remote.ssh.SSHShell`
(:mod:`autotune.remote._ssh_shell`), which owns the connection state; import the public
:data:`WATCHDOG_GRACE_S` from :mod:`autotune.remote.ssh`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import paramiko
from fabric import Config, Connection
from fabric.runners import Remote

#: Exit status paramiko reports when the channel closed without one (connection lost).
_NO_EXIT_STATUS = -1


class _Connection(Connection):
    """A fabric Connection that opens once. fabric would silently reconnect a dead one on
    the next command, skipping :class:`SSHShell`'s checks and bookkeeping; instead the
    command fails as a dropped connection and the shell opens a fresh one."""

    # A class attribute, so invoke's DataProxy treats it as a real attribute, not config.
    autotune_opened = False

    def open(self) -> Any:
        if self.autotune_opened and not self.is_connected:
            raise EOFError("SSH connection closed")
        result = super().open()
        self.autotune_opened = True
        return result


class _Remote(Remote):  # type: ignore[misc]  # fabric is untyped
    """fabric's remote runner, whose timeout kill cannot raise in its timer thread.

    invoke kills a command past its timeout from a ``threading.Timer``; fabric's kill closes
    the channel. When the command ends as the timer fires (a busy machine), ``run`` returns
    while that thread still runs, and a connection closed meanwhile (the shell discards it,
    or the study ends) makes ``channel.close()`` raise ``EOFError`` in the thread: nothing is
    lost (the channel is gone either way) but pytest and Python report an unhandled thread
    exception. A channel that cannot be closed any more needs no killing."""

    def kill(self) -> None:
        with suppress(EOFError, OSError, paramiko.SSHException):
            super().kill()


def _fabric_config() -> Config:
    # An explicit empty SSHConfig and lazy=True: no ssh_config or fabric.yaml is read.
    return Config(
        ssh_config=paramiko.SSHConfig(),
        lazy=True,
        overrides={
            "load_ssh_configs": False,
            "runners": {**Config.global_defaults()["runners"], "remote": _Remote},
        },
    )


def _brief(command: str, limit: int = 80) -> str:
    text = " ".join(command.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _exc_text(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


WATCHDOG_GRACE_S = 5.0
"""Beyond a command's own timeout, how long to wait for a host that stopped answering."""


class _NoAnswer(Exception):
    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)


@contextmanager
def _watchdog(conn: Any, seconds: float) -> Iterator[threading.Event]:
    """Close ``conn`` if the block still runs after ``seconds``.

    paramiko waits for sshd's reply to a channel request (exec, sftp) and for SFTP replies
    without any timeout, and invoke's command timer starts only once exec returned: a host
    that is up but wedged (swapping, a frozen sshd) would hold the tuner forever.
    """
    fired = threading.Event()

    def expire() -> None:
        fired.set()
        _close_quietly(conn)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield fired
    finally:
        timer.cancel()


def _is_drop(exc: BaseException, conn: Any) -> bool:
    """Whether ``exc`` means the connection is gone (as opposed to e.g. permission denied)."""
    if not conn.is_connected or isinstance(exc, (EOFError, ConnectionError)):
        return True
    text = str(exc).lower()
    return "socket is closed" in text or "session not active" in text


def _close_quietly(conn: Any) -> None:
    with suppress(Exception):
        conn.close()
    with suppress(Exception):
        conn.client.close()
