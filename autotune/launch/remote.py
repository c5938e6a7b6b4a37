"""Services run by a service manager on a host: over SSH, or on this machine.

Each service names a host (deployment ``hosts:``; none = this machine through a local shell)
and a manager (``process``: a detached process with a pidfile; ``systemd``: a drop-in on the
unit). The launcher keeps the contract of :class:`~autotune.launch.base.Launcher`: restart
only changed services, workers before the router, health-gated, and fail fast: every poll
checks that the service is alive and scans its new log lines, so a CUDA OOM or NCCL error is
reported seconds after the line is written, not at the readiness timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from autotune.errors import LaunchError
from autotune.launch.base import EventCallback, Launcher, RunningState
from autotune.launch.classify import FATAL_WHILE_ALIVE, FailureClass, classify_line, classify_log
from autotune.launch.health import HealthProber
from autotune.remote.managers import ServiceManager, create_manager
from autotune.remote.shell import LocalShell, Shell, ShellError
from autotune.specs import ServiceSpec

DEFAULT_UNIT_DIR = "/etc/systemd/system"

ShellFactory = Callable[[str | None], Shell]
"""Host name (None = this machine) -> its shell."""


@dataclass
class _Started:
    spec: ServiceSpec
    fingerprint: str
    started_mono: float
    log_offset: int
    checked_mono: float = 0.0
    ready: bool = False


def _noop(service: str, event: str) -> None:
    return None


class RemoteLauncher(Launcher):
    """Runs each :class:`ServiceSpec` through the manager its ``manager`` field names."""

    def __init__(
        self,
        *,
        shells: ShellFactory,
        deployment: str,
        run_dirs: Mapping[str | None, str] | None = None,
        unit_dirs: Mapping[str | None, str] | None = None,
        stop_grace_s: float = 10.0,
        poll_interval_s: float = 0.1,
        host_check_interval_s: float = 1.0,
        probe_timeout_s: float = 2.0,
    ) -> None:
        super().__init__(poll_interval_s=poll_interval_s)
        self.host_check_interval_s = host_check_interval_s
        self._shells = shells
        self.deployment = deployment
        self.run_dirs = dict(run_dirs or {})
        self.unit_dirs = dict(unit_dirs or {})
        self.stop_grace_s = stop_grace_s
        self._prober = HealthProber(connect_timeout_s=1.0, read_timeout_s=probe_timeout_s)
        self._managers: dict[tuple[str | None, str], ServiceManager] = {}
        self._started: dict[str, _Started] = {}

    # ----------------------------------------------------------------- managers
    def manager_for(self, spec: ServiceSpec) -> ServiceManager:
        kind: Literal["process", "systemd"] = "systemd" if spec.manager == "systemd" else "process"
        key = (spec.on, kind)
        if key not in self._managers:
            self._managers[key] = create_manager(
                kind,
                shell=self._shells(spec.on),
                deployment=self.deployment,
                run_dir=self.run_dirs.get(spec.on),
                unit_dir=self.unit_dirs.get(spec.on, DEFAULT_UNIT_DIR),
            )
        return self._managers[key]

    def _host_error(self, spec: ServiceSpec, exc: ShellError) -> LaunchError:
        return LaunchError(
            f"host {exc.host} unreachable: {exc.reason}",
            service=spec.name,
            failure=FailureClass.host_unreachable.value,
        )

    # ----------------------------------------------------------------- primitives
    def _current(self) -> dict[str, RunningState]:
        out = {}
        for name, s in self._started.items():
            try:
                alive = self.manager_for(s.spec).alive(name)
            except ShellError:
                alive = False
            out[name] = RunningState(s.fingerprint, alive=alive, ready=s.ready)
        return out

    def _stop(self, names: Sequence[str], on_event: EventCallback) -> None:
        started = [self._started[n] for n in names if n in self._started]

        def stop(s: _Started) -> None:
            on_event(s.spec.name, "stopping")
            self.manager_for(s.spec).stop(s.spec.name, grace_s=self.stop_grace_s)
            on_event(s.spec.name, "stopped")

        with ThreadPoolExecutor(max_workers=max(1, len(started))) as pool:
            for future in [pool.submit(stop, s) for s in started]:
                future.result()
        for s in started:
            self._started.pop(s.spec.name, None)

    def _start(self, spec: ServiceSpec) -> None:
        manager = self.manager_for(spec)
        try:
            _, offset = manager.log_since(spec.name, 0)
            manager.start(spec)
        except ShellError as exc:
            raise self._host_error(spec, exc) from None
        self._started[spec.name] = _Started(
            spec=spec,
            fingerprint=spec.fingerprint(),
            started_mono=time.monotonic(),
            log_offset=offset,
        )

    def _poll_ready(self, spec: ServiceSpec) -> bool:
        s = self._started[spec.name]
        if s.ready:
            return True
        # The health probe is a local HTTP request; checking the process and its new log
        # lines costs SSH round trips, so it runs at most every host_check_interval_s (a
        # crash is still reported within about that long).
        now = time.monotonic()
        if now - s.checked_mono >= self.host_check_interval_s:
            s.checked_mono = now
            self._check_host_side(spec, s)
        if self._prober.probe(spec.health_url).ok:
            s.ready = True
            return True
        if time.monotonic() - s.started_mono > spec.ready_timeout_s:
            tail = self.manager_for(spec).log_tail(spec.name)
            self._stop([spec.name], _noop)
            raise LaunchError(
                f"not healthy after {spec.ready_timeout_s:g} s ({spec.health_url})",
                service=spec.name,
                failure=FailureClass.readiness_timeout.value,
                log_tail=tail,
            )
        return False

    def _check_host_side(self, spec: ServiceSpec, s: _Started) -> None:
        """Raise LaunchError when the service exited or logged a fatal line."""
        manager = self.manager_for(spec)
        try:
            text, s.log_offset = manager.log_since(spec.name, s.log_offset)
            alive = manager.alive(spec.name)
        except ShellError as exc:
            raise self._host_error(spec, exc) from None
        fatal = any(
            (hit := classify_line(line)) and hit[1] in FATAL_WHILE_ALIVE
            for line in text.splitlines()
        )
        if not alive or fatal:
            self._fail(spec, exited=not alive)

    def _fail(self, spec: ServiceSpec, *, exited: bool) -> None:
        manager = self.manager_for(spec)
        tail = manager.log_tail(spec.name, lines=200)
        found = classify_log(tail)
        self._stop([spec.name], _noop)
        failure = found.failure
        if exited and failure == FailureClass.unknown:
            failure = FailureClass.exited
        what = "exited" if exited else "fatal error while starting (stopped)"
        raise LaunchError(
            f"{what}" + (f": {found.line}" if found.line else ""),
            service=spec.name,
            failure=failure.value,
            log_tail="\n".join(tail.splitlines()[-60:]),
        )

    def _fetch_info(self, spec: ServiceSpec) -> dict[str, Any] | None:
        return self._prober.fetch_json(spec.info_url) if spec.info_url else None

    def log_tails(self, specs: Mapping[str, ServiceSpec], *, lines: int = 40) -> str:
        parts = []
        for name, spec in specs.items():
            try:
                tail = self.manager_for(spec).log_tail(name, lines=lines)
            except ShellError as exc:
                tail = f"(log unavailable: {exc.reason})"
            if tail:
                parts.append(f"--- {name} ({spec.on or 'local'})\n{tail}")
        return "\n".join(parts)

    def stop_all(self) -> None:
        if self._started:
            self._stop(list(reversed(self._started)), _noop)
        self._info.clear()

    def restore(
        self, specs: Mapping[str, ServiceSpec], *, on_event: EventCallback | None = None
    ) -> list[str]:
        """Undo what autotune did to each service's host: drop-ins removed and units back to
        their pre-tuning state, tuner-started processes stopped. Returns what was restored."""
        emit = on_event or _noop
        done = []
        for name in reversed(list(specs)):
            spec = specs[name]
            emit(name, "restoring")
            self.manager_for(spec).restore(name)
            self._started.pop(name, None)
            done.append(name)
            emit(name, "restored")
        return done

    def detach(self) -> None:
        self._started.clear()
        self.close()

    def close(self) -> None:
        try:
            self.stop_all()
        finally:
            self._prober.close()
            for manager in self._managers.values():
                manager.shell.close()


def local_shells(host: str | None) -> Shell:
    """Every service on this machine (a deployment without ``hosts:``)."""
    if host is not None:
        raise ValueError(f"no SSH hosts configured, but a service runs on {host!r}")
    return LocalShell()
