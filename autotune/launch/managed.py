"""The one launcher: the lifecycle of services, whatever runs them.

Every service names a manager (:attr:`ServiceSpec.manager`): ``local`` (a child process of
the tuner), ``process`` (a detached process with a pidfile, over a shell) or ``systemd``
(a drop-in on a unit, over a shell). A :class:`~autotune.remote.managers.ServiceManager`
only starts, stops and reads logs; everything else is here, once, for all of them:

* start order, concurrency and "restart only what changed" (:class:`Launcher.apply`);
* readiness: each poll probes the health URL; every ``manager.check_interval_s`` (each
  poll on this machine, once a second over SSH) it also checks that the main process is
  alive and scans the new log lines, so a CUDA OOM or an NCCL error is reported seconds
  after the line is written, not at the readiness timeout;
* failure classification from the whole log since the start (:class:`LogScan`), the
  wording of every start failure, ``host_unreachable`` when the shell loses its host;
* the start-up stages those scans read, with when, for the trial's record
  (:mod:`autotune.launch.startup`);
* ``/server_info`` read once a service is healthy;
* stops in reverse dependency order: a service only after what depends on it, independent
  ones concurrently.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from autotune.errors import LaunchError
from autotune.failures import FATAL_WHILE_ALIVE, Failure, LogScan
from autotune.launch.base import EventCallback, Launcher, RunningState
from autotune.launch.health import HealthProber, ProbeResult
from autotune.launch.startup import ServiceStartup, StageMark
from autotune.remote.managers.base import CLASSIFY_LINES, ServiceManager, last_lines
from autotune.remote.shell import ShellError
from autotune.specs import ServiceSpec

ManagerResolver = Callable[[ServiceSpec], ServiceManager]
"""The manager that runs a spec (the same object for every spec it runs)."""

TAIL_LINES = 60
"""Log lines a :class:`LaunchError` carries."""


@dataclass
class _Started:
    spec: ServiceSpec
    manager: ServiceManager
    fingerprint: str
    started_mono: float
    log_offset: int = 0
    checked_mono: float = -math.inf
    scan: LogScan = field(default_factory=LogScan)
    ready: bool = False
    marks: list[StageMark] = field(default_factory=list)
    """The start-up stage lines read so far, with when (:mod:`autotune.launch.startup`)."""

    def feed(self, text: str, fatal: Collection[Failure] = ()) -> bool:
        """Scan new log text; note the stages it enters as read now."""
        before = len(self.scan.entered)
        hit = self.scan.feed(text, fatal=fatal)
        at_s = time.monotonic() - self.started_mono
        self.marks.extend(StageMark(stage=st, at_s=at_s) for st in self.scan.entered[before:])
        return hit

    def startup(self, *, ready: bool) -> ServiceStartup:
        elapsed = time.monotonic() - self.started_mono
        if ready:
            return ServiceStartup(stages=list(self.marks), ready_s=elapsed)
        return ServiceStartup(stages=list(self.marks), failed_s=elapsed)


def _noop(service: str, event: str) -> None:
    return None


def exited_reason(code: int | None, line: str) -> str:
    """Why a start failed when the process ended (the one wording)."""
    what = "exited" if code is None else f"exited with code {code}"
    return what + (f": {line}" if line else "")


def fatal_reason(line: str) -> str:
    """Why a start failed on a fatal log line while the process still ran."""
    return "fatal error while starting (stopped)" + (f": {line}" if line else "")


def readiness_reason(spec: ServiceSpec, last: ProbeResult) -> str:
    """Why a start failed when the health URL never answered 200 in time."""
    return (
        f"not healthy after {spec.ready_timeout_s:g} s "
        f"({spec.health_url}: {last.status_code or last.detail})"
    )


class ManagedLauncher(Launcher):
    """Runs each :class:`ServiceSpec` through the manager ``managers(spec)`` returns.

    ``stop_grace_s`` is the SIGTERM-to-SIGKILL grace of every stop; ``fatal_while_alive``
    are the log classes that fail a start even though the process has not exited (after
    them SGLang's main process often hangs instead of exiting). ``known`` are managers to
    ask for leftovers before any spec names them.
    """

    def __init__(
        self,
        managers: ManagerResolver,
        *,
        known: Iterable[ServiceManager] = (),
        stop_grace_s: float = 10.0,
        poll_interval_s: float = 0.1,
        connect_timeout_s: float = 1.0,
        probe_timeout_s: float = 2.0,
        fatal_while_alive: Collection[Failure] = FATAL_WHILE_ALIVE,
    ) -> None:
        super().__init__(poll_interval_s=poll_interval_s)
        self._resolve = managers
        self._managers: list[ServiceManager] = list(known)
        self.stop_grace_s = stop_grace_s
        self.fatal_while_alive = frozenset(fatal_while_alive)
        self._prober = HealthProber(
            connect_timeout_s=connect_timeout_s, read_timeout_s=probe_timeout_s
        )
        self._started: dict[str, _Started] = {}

    def manager_for(self, spec: ServiceSpec) -> ServiceManager:
        manager = self._resolve(spec)
        if all(manager is not m for m in self._managers):
            self._managers.append(manager)
        return manager

    # ----------------------------------------------------------------- primitives
    def _prepare(self, on_event: EventCallback) -> None:
        for manager in self._managers:
            manager.stop_leftovers(on_event)

    def _current(self) -> dict[str, RunningState]:
        out = {}
        for name, s in self._started.items():
            try:
                alive = s.manager.alive(name)
            except ShellError:
                alive = False
            out[name] = RunningState(s.fingerprint, alive=alive, ready=s.ready)
        return out

    def _stop(self, names: Sequence[str], on_event: EventCallback) -> None:
        """Stop in waves: a service once nothing still running depends on it."""
        pending = [n for n in dict.fromkeys(names) if n in self._started]
        error: BaseException | None = None
        while pending:
            wave = [
                n
                for n in pending
                if not any(n in self._started[m].spec.depends_on for m in pending if m != n)
            ] or pending  # a cycle cannot be started, but stop it all the same
            error = error or self._stop_wave(wave, on_event)
            pending = [n for n in pending if n not in wave]
        if error is not None:
            raise error

    def _stop_wave(self, names: list[str], on_event: EventCallback) -> BaseException | None:
        def stop(name: str) -> None:
            s = self._started[name]
            on_event(name, "stopping")
            s.manager.stop(name, grace_s=self.stop_grace_s)
            self._started.pop(name, None)
            on_event(name, "stopped")

        if len(names) == 1:
            try:
                stop(names[0])
            except Exception as exc:  # raised once the later waves are stopped too
                return exc
            return None
        with ThreadPoolExecutor(max_workers=len(names)) as pool:
            futures = [pool.submit(stop, n) for n in names]
        errors = [f.exception() for f in futures]
        return next((e for e in errors if e is not None), None)

    def _start(self, spec: ServiceSpec) -> None:
        manager = self.manager_for(spec)
        try:
            manager.start(spec)
        except ShellError as exc:
            raise _host_error(spec, exc) from None
        self._started[spec.name] = _Started(
            spec=spec,
            manager=manager,
            fingerprint=spec.fingerprint(),
            started_mono=time.monotonic(),
        )

    def _poll_ready(self, spec: ServiceSpec) -> bool:
        s = self._started[spec.name]
        if s.ready:
            return True
        now = time.monotonic()
        if now - s.checked_mono >= s.manager.check_interval_s:
            s.checked_mono = now
            self._check_process(s)
        probe = self._prober.probe(spec.health_url)
        if probe.ok:
            s.ready = True
            return True
        if time.monotonic() - s.started_mono > spec.ready_timeout_s:
            tail = self._tail(s, TAIL_LINES)
            startup = s.startup(ready=False)
            self._stop([spec.name], _noop)
            raise LaunchError(
                readiness_reason(spec, probe),
                service=spec.name,
                failure=Failure.readiness_timeout.value,
                log_tail=tail,
                startup=startup.model_dump(),
            )
        return False

    def _check_process(self, s: _Started) -> None:
        """Raise LaunchError when the service exited or logged a fatal line."""
        name = s.spec.name
        try:
            text, s.log_offset = s.manager.log_since(name, s.log_offset)
            alive = s.manager.alive(name)
        except ShellError as exc:
            raise _host_error(s.spec, exc) from None
        fatal = s.feed(text, fatal=self.fatal_while_alive)
        if not alive or fatal:
            self._fail(s, exited=not alive)

    def _fail(self, s: _Started, *, exited: bool) -> None:
        """Stop the service, classify its log since the start, raise LaunchError."""
        name = s.spec.name
        startup = s.startup(ready=False)  # the stages as read: the tail below repeats lines
        try:
            text = s.manager.log_tail(name, lines=CLASSIFY_LINES)
            code = s.manager.exit_code(name) if exited else None
        except ShellError:
            text, code = "", None
        s.scan.feed(text)  # what was written after the last scan (earlier lines win ties)
        found = s.scan.result
        self._stop([name], _noop)
        failure = found.failure
        if exited and failure is Failure.unknown:
            failure = Failure.exited
        raise LaunchError(
            exited_reason(code, found.reason) if exited else fatal_reason(found.reason),
            service=name,
            failure=failure.value,
            log_tail=last_lines(text, TAIL_LINES),
            startup=startup.model_dump(),
        )

    def _tail(self, s: _Started, lines: int) -> str:
        try:
            return s.manager.log_tail(s.spec.name, lines=lines)
        except ShellError as exc:
            return f"(log unavailable: {exc.reason})"

    def _fetch_info(self, spec: ServiceSpec) -> dict[str, Any] | None:
        return self._prober.fetch_json(spec.info_url) if spec.info_url else None

    def _startup_of(self, name: str, *, ready: bool) -> ServiceStartup | None:
        s = self._started.get(name)
        if s is None:
            return None
        if ready:  # the lines written since the last check: the last stage's line is often
            try:  # printed a moment before the server answers
                text, s.log_offset = s.manager.log_since(name, s.log_offset)
                s.feed(text)
            except ShellError:
                pass
        return s.startup(ready=ready)

    # ----------------------------------------------------------------- contract
    def log_tails(self, specs: Mapping[str, ServiceSpec], *, lines: int = 40) -> str:
        parts = []
        for name, spec in specs.items():
            manager = self.manager_for(spec)
            try:
                tail = manager.log_tail(name, lines=lines)
                where = manager.log_location(name)
            except ShellError as exc:
                tail, where = f"(log unavailable: {exc.reason})", manager.where
            if not tail and name in self._started:
                # a slow start that printed nothing yet is still worth naming in a report
                tail = "(nothing logged since its start)"
            if tail:
                parts.append(f"--- {name} ({where})\n{tail}")
        return "\n".join(parts)

    def stop_all(self) -> None:
        if self._started:
            self._stop(list(reversed(self._started)), _noop)
        for manager in self._managers:
            manager.stop_leftovers(_noop)
        self._info.clear()

    def restore(
        self, specs: Mapping[str, ServiceSpec], *, on_event: EventCallback | None = None
    ) -> list[str]:
        """Undo what autotune did to each service's host: drop-ins removed and units back to
        their pre-tuning state, tuner-started processes stopped. Returns what was restored."""
        emit = on_event or _noop
        done = []
        for name in reversed(list(specs)):
            emit(name, "restoring")
            self.manager_for(specs[name]).restore(name)
            self._started.pop(name, None)
            done.append(name)
            emit(name, "restored")
        for manager in self._managers:
            manager.stop_leftovers(emit)
        return done

    def detach(self) -> None:
        self._started.clear()
        for manager in self._managers:
            manager.detach()
        self._release()

    def close(self) -> None:
        try:
            self.stop_all()
        finally:
            self._release()

    def _release(self) -> None:
        self._prober.close()
        for manager in self._managers:
            manager.close()


def _host_error(spec: ServiceSpec, exc: ShellError) -> LaunchError:
    return LaunchError(
        f"host {exc.host} unreachable: {exc.reason}",
        service=spec.name,
        failure=Failure.host_unreachable.value,
    )
