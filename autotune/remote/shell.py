"""The narrow interface every service manager uses to act on a host.

A :class:`Shell` runs a command line and writes a file, nothing more, so the same manager
code drives a host over SSH (:mod:`autotune.remote.ssh`) or this machine
(:class:`LocalShell`, used for local systemd and in unit tests).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from autotune.errors import AutotuneError


@dataclass(frozen=True)
class CommandResult:
    """Exit status and output of one command."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class Shell(ABC):
    """A host's shell. Commands are POSIX ``sh`` lines; quoting is the caller's job
    (always ``shlex.quote`` values, never interpolate them raw)."""

    name: str

    @abstractmethod
    def run(self, command: str, *, timeout_s: float = 60.0, sudo: bool = False) -> CommandResult:
        """Run ``command`` (via ``sh -c``); ``sudo`` prefixes ``sudo -n`` unless root.

        Raises :class:`autotune.errors.LaunchError`-free :class:`ShellError` only when the
        host cannot be reached or the command times out; a non-zero exit is a result.
        """

    @abstractmethod
    def put_text(self, path: str, text: str, *, mode: int = 0o644, sudo: bool = False) -> None:
        """Write ``text`` to ``path`` atomically (temporary file in the same directory, then
        rename) with ``mode``; parent directories are created."""

    def close(self) -> None:  # noqa: B027 - optional
        """Release the connection, if any."""


class ShellError(AutotuneError):
    """The host could not be reached, or a command timed out. ``reason`` is for the user.

    An AutotuneError: one that reaches the command line (``apply``, ``restore``) is printed as
    ``host: reason``, not as a traceback."""

    def __init__(self, host: str, reason: str) -> None:
        super().__init__(f"{host}: {reason}")
        self.host = host
        self.reason = reason


class LocalShell(Shell):
    """This machine, through ``/bin/sh``."""

    def __init__(self, *, name: str = "localhost", env: dict[str, str] | None = None) -> None:
        self.name = name
        self._env = env

    def run(self, command: str, *, timeout_s: float = 60.0, sudo: bool = False) -> CommandResult:
        if sudo and os.geteuid() != 0:
            command = f"sudo -n sh -c {_quote(command)}"
        try:
            proc = subprocess.run(
                ["/bin/sh", "-c", command],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env=self._env,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise ShellError(self.name, f"command timed out after {timeout_s:g}s") from None
        return CommandResult(proc.returncode, proc.stdout, proc.stderr)

    def put_text(self, path: str, text: str, *, mode: int = 0o644, sudo: bool = False) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.chmod(tmp, mode)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)
