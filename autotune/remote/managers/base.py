"""The service-manager contract: run one service of a deployment on a host.

A manager starts and stops services and reads their logs; everything else about a service's
lifecycle (start order, readiness, failing fast on a fatal log line, classifying the
failure, deadlines, restarting only what changed) is the launcher's
(:class:`autotune.launch.managed.ManagedLauncher`), written once for every manager. Three
implement it: :class:`~autotune.remote.managers.local.LocalManager` (child processes of the
tuner), :class:`~autotune.remote.managers.process.ProcessManager` (detached processes with a
pidfile) and :class:`~autotune.remote.managers.systemd.SystemdManager` (a drop-in on a unit).

The last two act on their host only through a :class:`~autotune.remote.shell.Shell` (SSH,
or this machine), so the same code drives local systemd, remote systemd and plain remote
processes (:class:`ShellManager`). Everything they need to undo their work is kept **on the
host** under ``run_dir`` (default ``~/.autotune/run/<deployment>``, mode 0700), so
``autotune restore`` works from a fresh process after a crash of the tuner.

Logs: :meth:`ServiceManager.log_since` returns the log since the service's last start from
an opaque offset (0 = from the start); the launcher scans the new lines for fatal errors
while the service loads, and :meth:`ServiceManager.classify` classifies the last lines with
:func:`autotune.failures.classify_log`.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

from autotune.errors import ConfigError, LaunchError
from autotune.failures import Classification, Failure, classify_log
from autotune.remote.managers import hostops
from autotune.remote.shell import Shell
from autotune.specs import ServiceSpec

DEFAULT_RUN_DIR = "~/.autotune/run/{deployment}"
RUN_DIR_MODE = 0o700
"""The run directory holds environment files, service logs and saved drop-ins, any of which
may carry a credential: owner only."""
CLASSIFY_LINES = 400
"""Log lines :meth:`ServiceManager.classify` looks at (the most specific match wins)."""

EventCallback = Callable[[str, str], None]
"""``on_event(service, event)``, as the launcher's."""

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


def port_in_use(spec: ServiceSpec, *, where: str, waited_s: float) -> LaunchError:
    """The error of a start whose port stayed taken (one wording for every manager)."""
    return LaunchError(
        f"port {spec.host}:{spec.port} on {where} is in use by another process (still taken "
        f"after {waited_s:g} s; see `ss -ltnp 'sport = :{spec.port}'` there)",
        service=spec.name,
        failure=Failure.port_in_use.value,
    )


class ServiceManager(ABC):
    """Starts, stops and watches the services of one deployment on one host.

    Narrow on purpose: no readiness, no ordering, no classification policy. ``kind`` is the
    :attr:`ServiceSpec.manager` value it serves; ``check_interval_s`` is how often the
    launcher may ask :meth:`alive` and :meth:`log_since` while a service starts (each is a
    round trip on a remote host; free on this machine).
    """

    kind: ClassVar[str] = ""
    check_interval_s: float = 1.0

    @property
    @abstractmethod
    def where(self) -> str:
        """The host, as messages name it."""

    @abstractmethod
    def start(self, spec: ServiceSpec) -> None:
        """(Re)start the service as ``spec`` says; returns once it has been launched.

        A previous instance (this session's or a crashed one's) is stopped first; the start
        waits (bounded) until the port is free. Raises :class:`LaunchError`
        (``port_in_use``, ``exited``, ...) or :class:`ConfigError`.
        """

    @abstractmethod
    def stop(self, spec_or_name: ServiceSpec | str, *, grace_s: float = 10.0) -> None:
        """Stop the service: SIGTERM, SIGKILL after ``grace_s``. Stopping a stopped or
        unknown service does nothing."""

    @abstractmethod
    def alive(self, name: str) -> bool:
        """True while the main process of the service started by this manager (or an
        earlier one on the same ``run_dir``) is running."""

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

    def exit_code(self, name: str) -> int | None:
        """The exit status of the service's last run once it ended, None when unknown."""
        return None

    def log_location(self, name: str) -> str:
        """Where a person finds the service's log (named in failure reports)."""
        return self.where

    def stop_leftovers(self, on_event: EventCallback) -> None:  # noqa: B027 - optional hook
        """Stop what an earlier session on this ``run_dir`` left running and a :meth:`start`
        would not replace (the launcher calls it before each apply and in ``stop_all``)."""

    def classify(self, name: str) -> Classification:
        """The failure class of the service's log since its last start."""
        return classify_log(self.log_tail(name, lines=CLASSIFY_LINES))

    def detach(self) -> None:  # noqa: B027 - optional hook
        """Forget the services without stopping them (they keep running; the records on the
        host let a later manager find them)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections, if any."""


class ShellManager(ServiceManager):
    """What the managers that act through a :class:`Shell` share: the run directory on the
    host and the bounded waits before a start.

    ``port_wait_s`` bounds the wait for the service's port to be free before a start (the
    previous instance's socket, or a foreign process: then ``port_in_use``);
    ``gpu_wait_s`` bounds the wait for the previous instance's GPU memory to be released.
    """

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

    @property
    def where(self) -> str:
        return self.shell.name

    def close(self) -> None:
        self.shell.close()

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
            raise port_in_use(spec, where=self.shell.name, waited_s=self.port_wait_s)
        held = hostops.wait_gpu_released(self.shell, pids=old_pids, timeout_s=self.gpu_wait_s)
        if held:
            where = ", ".join(f"pid {pid} ({mem})" for pid, mem in sorted(held.items()))
            raise LaunchError(
                f"GPU memory of the previous instance is still held on {self.shell.name} "
                f"after {self.gpu_wait_s:g} s: {where}; starting now would fail with an "
                "out-of-memory error unrelated to the configuration",
                service=spec.name,
                failure=Failure.unknown.value,
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
