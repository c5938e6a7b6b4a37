"""The service-manager contract: run one service of a deployment on a host.

A manager acts on its host only through a :class:`~autotune.remote.shell.Shell` (SSH, or
this machine), so the same code drives local systemd, remote systemd and plain remote
processes. It starts and stops services and reads their logs; readiness (the health URL)
is the launcher's job. Everything it needs to undo its work is kept **on the host** under
``run_dir`` (default ``~/.autotune/run/<deployment>``, mode 0700), so ``autotune restore``
works from a fresh process after a crash of the tuner.

Logs: :meth:`ServiceManager.log_since` returns the log since the service's last start from
an opaque offset (0 = from the start); the launcher scans the new lines for fatal errors
while the service loads, and :meth:`ServiceManager.classify` classifies the last lines with
:func:`autotune.launch.classify.classify_log`.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from typing import Any

from autotune.errors import ConfigError, LaunchError
from autotune.launch.classify import Classification, FailureClass, classify_log
from autotune.remote.managers import hostops
from autotune.remote.shell import Shell
from autotune.specs import ServiceSpec

DEFAULT_RUN_DIR = "~/.autotune/run/{deployment}"
RUN_DIR_MODE = 0o700
"""The run directory holds environment files, service logs and saved drop-ins, any of which
may carry a credential: owner only."""
CLASSIFY_LINES = 400
"""Log lines :meth:`ServiceManager.classify` looks at (the most specific match wins)."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$")


def check_name(value: str, *, what: str, field: str) -> str:
    """A deployment or service name used in file names on the host."""
    if not _NAME.fullmatch(value) or value in (".", ".."):
        raise ConfigError(
            f"{what} name {value!r} cannot be used in a file name on the host "
            "(letters, digits, '_', '.', '@', '-'; not starting with a punctuation mark)",
            field=field,
        )
    return value


class ServiceManager(ABC):
    """Starts, stops and watches the services of one deployment on one host.

    ``port_wait_s`` bounds the wait for the service's port to be free before a start (the
    previous instance's socket, or a foreign process: then ``port_in_use``);
    ``gpu_wait_s`` bounds the wait for the previous instance's GPU memory to be released.
    """

    kind: str = ""

    def __init__(
        self,
        *,
        shell: Shell,
        deployment: str,
        run_dir: str | None = None,
        port_wait_s: float = 10.0,
        gpu_wait_s: float = 30.0,
    ) -> None:
        self._run_dir_created = False
        self.shell = shell
        self.deployment = check_name(deployment, what="deployment", field="deployment")
        self._run_dir_spec = run_dir or DEFAULT_RUN_DIR.format(deployment=deployment)
        self._run_dir: str | None = None
        self.port_wait_s = port_wait_s
        self.gpu_wait_s = gpu_wait_s

    # ------------------------------------------------------------------ contract
    @abstractmethod
    def start(self, spec: ServiceSpec) -> None:
        """(Re)start the service as ``spec`` says; returns once it has been launched.

        A running previous instance is stopped first; the start waits (bounded) until the
        port is free and the old instance's GPU memory is released. Raises
        :class:`LaunchError` (``port_in_use``, ``exited``, ...) or :class:`ConfigError`.
        """

    @abstractmethod
    def stop(self, spec_or_name: ServiceSpec | str, *, grace_s: float = 10.0) -> None:
        """Stop the service: SIGTERM, SIGKILL after ``grace_s``. Stopping a stopped or
        unknown service does nothing."""

    @abstractmethod
    def alive(self, name: str) -> bool:
        """True while the service started by this manager (or an earlier one on the same
        ``run_dir``) is running."""

    @abstractmethod
    def log_tail(self, name: str, *, lines: int = 80) -> str:
        """The last ``lines`` lines the service logged since its last start."""

    @abstractmethod
    def log_since(self, name: str, offset: int) -> tuple[str, int]:
        """Complete log lines after ``offset`` (0: the last start) and the offset to pass
        next time. Offsets before the last start mean the last start."""

    @abstractmethod
    def restore(self, name: str) -> None:
        """Undo what autotune did on the host for this service."""

    @abstractmethod
    def inventory(self) -> dict[str, Any]:
        """What autotune changed on the host (for ``autotune restore``), JSON-serialisable."""

    def classify(self, name: str) -> Classification:
        """The failure class of the service's log since its last start."""
        return classify_log(self.log_tail(name, lines=CLASSIFY_LINES))

    # ------------------------------------------------------------------ shared
    @property
    def run_dir(self) -> str:
        """The run directory on the host, absolute (``~`` resolved there)."""
        if self._run_dir is None:
            self._run_dir = hostops.resolve_dir(self.shell, self._run_dir_spec, create=False)
        return self._run_dir

    def _ensure_run_dir(self) -> str:
        # One round trip per manager, not per start: each SSH command costs ~0.15 s.
        if not self._run_dir_created:
            self._run_dir = hostops.resolve_dir(
                self.shell, self._run_dir_spec, create=True, mode=RUN_DIR_MODE
            )
            self._run_dir_created = True
        assert self._run_dir is not None
        return self._run_dir

    @staticmethod
    def _name_of(spec_or_name: ServiceSpec | str) -> str:
        name = spec_or_name.name if isinstance(spec_or_name, ServiceSpec) else spec_or_name
        return check_name(name, what="service", field="services")

    def _wait_resources(self, spec: ServiceSpec, *, old_pids: list[int]) -> None:
        """Bounded waits before a start: the port, then the old instance's GPU memory."""
        if not hostops.wait_port_free(
            self.shell, host=spec.host, port=spec.port, timeout_s=self.port_wait_s
        ):
            raise LaunchError(
                f"port {spec.port} on {self.shell.name} is in use by another process (still "
                f"taken after {self.port_wait_s:g} s; see `ss -ltnp 'sport = :{spec.port}'` "
                "there)",
                service=spec.name,
                failure=FailureClass.port_in_use.value,
            )
        held = hostops.wait_gpu_released(self.shell, pids=old_pids, timeout_s=self.gpu_wait_s)
        if held:
            where = ", ".join(f"pid {pid} ({mem})" for pid, mem in sorted(held.items()))
            raise LaunchError(
                f"GPU memory of the previous instance is still held on {self.shell.name} "
                f"after {self.gpu_wait_s:g} s: {where}; starting now would fail with an "
                "out-of-memory error unrelated to the configuration",
                service=spec.name,
                failure=FailureClass.unknown.value,
            )


def lines_after(data: bytes, *, complete_only: bool) -> tuple[str, int]:
    """Decoded text of ``data`` up to its last newline and the number of bytes it used."""
    if complete_only:
        end = data.rfind(b"\n")
        if end < 0:
            return "", 0
        data = data[: end + 1]
    return data.decode(errors="replace"), len(data)


def last_lines(text: str, lines: int) -> str:
    """The last ``lines`` lines of ``text``."""
    if lines <= 0:
        return ""
    return "\n".join(text.splitlines()[-lines:])
