"""The error hierarchy.

Every error a user can cause or meet derives from :class:`AutotuneError`; the CLI prints
``str(error)`` and exits non-zero, never a traceback. Errors about files always name the
file, the field and, where there is a closed set, the allowed values.

The whole tree (a class defined elsewhere names its module)::

    AutotuneError           raised on purpose; the CLI prints it as one line, exit code 2
    |-- ConfigError         a file or a CLI value is invalid (names file, field, allowed values)
    |-- LaunchError         a service did not become healthy (its failure class, its log tail)
    |-- BenchError          the load generator produced no measurement
    |   `-- BenchTimeout    ... because the server answered nothing in time
    |-- StorageError        the study storage cannot be opened, read or written
    |-- ShellError          remote.shell: a host is unreachable or a command on it timed out
    |   `-- HostKeyError    remote.ssh: a host's key is unknown or has changed (never retried)
    |-- HostFailure         trial.pipeline: a host was lost mid-trial; the run stops, resumable
    |-- Unscorable          trial.pipeline: measured, but the objective's figure is missing
    |-- ClaimedElsewhere    study.claims: another worker's trial is measuring this config
    |-- WorkerBusy          study.workers: a live process already runs under this worker name
    |-- DependencyError     launch.order: depends_on names an unknown service or makes a cycle
    `-- DomainError         space.params: a value is outside a parameter's domain

WorkerBusy, DependencyError and DomainError reach the user as a ConfigError that names the
option or the field; ClaimedElsewhere never reaches the user (the loop records the trial as
``claimed`` and goes on), nor does Unscorable (the trial is recorded infeasible with its
reason, ``no_telemetry``). Outside the tree: private exceptions (a leading underscore), which
never leave their module (or the private siblings it was split into, as ``remote/_ssh_*``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class AutotuneError(Exception):
    """Base class of every error autotune raises on purpose."""


class ConfigError(AutotuneError):
    """A file (search space, deployment, study) or a CLI value is invalid."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        field: str | None = None,
        allowed: Sequence[object] | None = None,
        closest: Sequence[object] | None = None,
    ) -> None:
        self.file = file
        self.field = field
        self.allowed = list(allowed) if allowed is not None else None
        self.closest = list(closest) if closest else None
        parts = []
        if file:
            parts.append(str(file))
        if field:
            parts.append(f"field '{field}'")
        head = ": ".join(parts)
        text = f"{head}: {message}" if head else message
        if self.allowed:
            text += f" (allowed: {', '.join(map(str, self.allowed))})"
        if self.closest:
            text += f" (closest: {', '.join(map(str, self.closest))})"
        super().__init__(text)
        self.message = message


class LaunchError(AutotuneError):
    """A service did not become healthy; ``failure`` is a class of :mod:`autotune.failures`."""

    def __init__(
        self,
        message: str,
        *,
        service: str,
        failure: str,
        log_tail: str = "",
        startup: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{service}: {failure}: {message}")
        self.service = service
        self.failure = failure
        self.reason = message
        self.log_tail = log_tail
        self.startup = startup
        """The failed start's stages as far as it got (``ServiceStartup``, dumped), if read."""


class BenchError(AutotuneError):
    """The load generator could not produce a measurement (no request completed, ...)."""


class BenchTimeout(BenchError):
    """The server answered nothing in time: the warm-up or the measure phase ran out of time
    before a request completed. Unlike a refused or failed request, this is what a server
    still compiling or stuck looks like, so the tuner looks at its log for the cause."""


class StorageError(AutotuneError):
    """The study storage cannot be opened, read or written."""
