"""The launcher contract: bring the running services to exactly a set of specs.

A restart costs minutes on real hardware, so :meth:`Launcher.apply` restarts only what
changed. Rules, in order:

* a service whose :meth:`ServiceSpec.fingerprint` changed, or whose process is gone, is
  stopped and started again;
* services of the previous apply that are not in ``specs`` are stopped;
* everything else keeps running, **including dependents of a restarted service** (the SGLang
  router reconnects to a restarted worker; restarting it would only cost time);
* stops go first (dependents before their dependencies); then services start as soon as
  every service they depend on is healthy, independent ones concurrently (prefill and decode
  load their weights at the same time), and the router only after both are healthy;
* a service started by an earlier apply that failed before it was healthy (another service
  failed first) is not restarted when unchanged: apply waits for it again.

On a failure :class:`~autotune.errors.LaunchError` is raised with the failure class; the
failed service is stopped and everything else is recorded as it is, so the next apply works.
On ``KeyboardInterrupt`` the services being started are stopped and the interrupt re-raised.
A ``deadline`` (a ``time.monotonic()`` instant, the trial's) caps the whole apply whatever
each service's own ``ready_timeout_s`` says: the services still starting are stopped and
:class:`~autotune.errors.LaunchError` (``trial_timeout``) is raised.

One subclass implements the per-service primitives for every way of running a service:
:class:`~autotune.launch.managed.ManagedLauncher`, over the service managers (test doubles
subclass this base directly).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from autotune.dependencies import DependencyError, dependency_order
from autotune.errors import ConfigError, LaunchError
from autotune.failures import Failure, classify_log
from autotune.launch.startup import ServiceStartup
from autotune.specs import ServiceSpec

_L = TypeVar("_L", bound="Launcher")

EventCallback = Callable[[str, str], None]
"""``on_event(service, event)``; events: stopping, stopped, starting, waiting, ready, kept,
failed."""


@dataclass(frozen=True)
class ApplyResult:
    """What one :meth:`Launcher.apply` did.

    ``restarted``: services (re)started by this apply, in start order (a service started by
    an earlier, failed apply and waited for here counts as restarted: it is a fresh process).
    ``kept``: services left running. ``stopped``: services stopped and not started again.
    ``seconds``: start-to-healthy seconds per restarted service. ``stop_seconds``: time spent
    stopping. ``total_seconds``: the whole apply. ``info``: ``/server_info`` JSON per service
    that has an ``info_url`` (read once after it became healthy).
    """

    restarted: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    stop_seconds: float = 0.0
    total_seconds: float = 0.0
    info: dict[str, dict[str, Any]] = field(default_factory=dict)
    startup: dict[str, ServiceStartup] = field(default_factory=dict)
    """The start-up stages of each restarted service whose launcher reads them."""


@dataclass(frozen=True)
class RunningState:
    """What a launcher knows about one service it runs."""

    fingerprint: str
    alive: bool
    ready: bool


def _noop(service: str, event: str) -> None:
    return None


class Launcher(ABC):
    """Starts, health-gates, keeps and stops the services of a deployment."""

    def __init__(self, *, poll_interval_s: float = 0.1) -> None:
        self.poll_interval_s = poll_interval_s
        self._info: dict[str, dict[str, Any]] = {}

    # ----------------------------------------------------------------- primitives
    @abstractmethod
    def _current(self) -> dict[str, RunningState]:
        """Services this launcher runs now (including started but not yet healthy)."""

    @abstractmethod
    def _stop(self, names: Sequence[str], on_event: EventCallback) -> None:
        """Stop these services (may run concurrently) and forget them."""

    @abstractmethod
    def _start(self, spec: ServiceSpec) -> None:
        """Start one service (its dependencies are healthy). Raises LaunchError."""

    @abstractmethod
    def _poll_ready(self, spec: ServiceSpec) -> bool:
        """One non-blocking readiness step: True once healthy.

        Raises LaunchError (after stopping the service) when it exited, logged a fatal
        error, or passed ``spec.ready_timeout_s``.
        """

    def _prepare(self, on_event: EventCallback) -> None:  # noqa: B027 - optional hook
        """Hook run at the start of every apply (e.g. stop leftovers of an earlier run)."""

    def _fetch_info(self, spec: ServiceSpec) -> dict[str, Any] | None:
        """The service's resolved arguments (``spec.info_url``), if it can be read."""
        return None

    def _startup_of(self, name: str, *, ready: bool) -> ServiceStartup | None:
        """The start-up stages of a service started by this apply, ``ready`` or failed just
        now, if this launcher reads them."""
        return None

    @abstractmethod
    def stop_all(self) -> None:
        """Stop every service this launcher (or, where it can tell, an earlier one) started."""

    # ----------------------------------------------------------------- contract
    def apply(
        self,
        specs: Mapping[str, ServiceSpec],
        *,
        on_event: EventCallback | None = None,
        deadline: float | None = None,
    ) -> ApplyResult:
        """Bring the running set to exactly ``specs`` (see the module docstring)."""
        emit = on_event or _noop
        t0 = time.monotonic()
        order = _start_order(specs)
        self._prepare(emit)
        current = self._current()

        to_stop = [n for n in current if n not in specs]
        removed = list(to_stop)
        to_start: set[str] = set()
        waiting: set[str] = set()
        kept: list[str] = []
        for name in order:
            state = current.get(name)
            if state is None:
                to_start.add(name)
            elif state.fingerprint != specs[name].fingerprint() or not state.alive:
                to_stop.append(name)
                to_start.add(name)
            elif state.ready:
                kept.append(name)
            else:
                waiting.add(name)
        for name in removed:
            self._info.pop(name, None)

        t_stop = time.monotonic()
        # Dependents before their dependencies: reverse start order; removed ones first.
        rank = {n: i for i, n in enumerate(order)}
        to_stop.sort(key=lambda n: -rank.get(n, len(order)))
        if to_stop:
            self._stop(to_stop, emit)
        stop_seconds = time.monotonic() - t_stop
        for name in kept:
            emit(name, "kept")

        startup: dict[str, ServiceStartup] = {}
        seconds = self._start_gated(specs, order, to_start, waiting, kept, emit, deadline, startup)
        restarted = [n for n in order if n in seconds]
        info = {n: self._info[n] for n in order if n in self._info}
        return ApplyResult(
            restarted=restarted,
            kept=kept,
            stopped=removed,
            seconds=seconds,
            stop_seconds=stop_seconds,
            total_seconds=time.monotonic() - t0,
            info=info,
            startup={n: startup[n] for n in restarted if n in startup},
        )

    def _start_gated(
        self,
        specs: Mapping[str, ServiceSpec],
        order: list[str],
        to_start: set[str],
        waiting: set[str],
        kept: list[str],
        emit: EventCallback,
        deadline: float | None,
        startup: dict[str, ServiceStartup],
    ) -> dict[str, float]:
        ready = set(kept)
        pending = [n for n in order if n in to_start or n in waiting]
        inflight: dict[str, float] = {}
        seconds: dict[str, float] = {}
        try:
            while pending or inflight:
                for name in list(pending):
                    if all(d in ready for d in specs[name].depends_on):
                        pending.remove(name)
                        inflight[name] = time.monotonic()
                        if name in waiting:
                            emit(name, "waiting")
                        else:
                            emit(name, "starting")
                            self._start(specs[name])
                progressed = False
                for name in list(inflight):
                    if self._poll_ready(specs[name]):
                        seconds[name] = time.monotonic() - inflight.pop(name)
                        ready.add(name)
                        stages = self._startup_of(name, ready=True)
                        if stages is not None:
                            startup[name] = stages
                        progressed = True
                        emit(name, "ready")
                        if specs[name].info_url:
                            info = self._fetch_info(specs[name])
                            if info is not None:
                                self._info[name] = info
                if inflight and deadline is not None and time.monotonic() >= deadline:
                    late = next(iter(inflight))
                    stages = self._startup_of(late, ready=False)
                    self._stop(list(inflight), emit)
                    raise LaunchError(
                        "the trial's deadline (trial_timeout_s) passed while it was starting",
                        service=late,
                        failure=Failure.trial_timeout.value,
                        log_tail=self.log_tails({late: specs[late]}),
                        startup=stages.model_dump() if stages is not None else None,
                    )
                if inflight and not progressed:
                    time.sleep(self.poll_interval_s)
        except LaunchError as exc:
            emit(exc.service, "failed")
            raise
        except BaseException:
            # Interrupted (KeyboardInterrupt, SystemExit, a bug): do not leave half-started
            # services behind; healthy ones stay recorded.
            if inflight:
                self._stop(list(inflight), emit)
            raise
        return seconds

    def log_tails(self, specs: Mapping[str, ServiceSpec], *, lines: int = 40) -> str:
        """The last log lines of each service since its start (for failure reports)."""
        return ""

    def running(self) -> list[str]:
        """Services this launcher started that are still alive (for the interrupt message)."""
        return [name for name, state in self._current().items() if state.alive]

    def check_alive(self, specs: Mapping[str, ServiceSpec]) -> LaunchError | None:
        """The first service of ``specs`` that died since it became healthy, as the error
        its log explains (``crashed`` when the log names no cause), or None.

        A benchmark against a deployment that lost a worker half-way measures nothing
        worth keeping, even when some requests succeeded.
        """
        current = self._current()
        for name in _start_order(specs):
            state = current.get(name)
            if state is not None and not state.alive:
                tail = self.log_tails({name: specs[name]})
                found = classify_log(tail)
                failure = Failure.crashed if found.failure is Failure.unknown else found.failure
                detail = f": {found.line}" if found.line else ""
                return LaunchError(
                    f"the service died while it was being measured{detail}",
                    service=name,
                    failure=failure.value,
                    log_tail=tail,
                )
        return None

    def restore(
        self, specs: Mapping[str, ServiceSpec], *, on_event: EventCallback | None = None
    ) -> list[str]:
        """Bring the hosts back to their pre-tuning state (the base: stop what was started)."""
        self.stop_all()
        return list(specs)

    def detach(self) -> None:  # noqa: B027 - optional hook
        """Release resources but leave the services running (``autotune apply``)."""

    def close(self) -> None:
        """Stop everything and release resources."""
        self.stop_all()

    def __enter__(self: _L) -> _L:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _start_order(specs: Mapping[str, ServiceSpec]) -> list[str]:
    for name, spec in specs.items():
        if spec.name != name:
            raise ConfigError(
                f"spec registered as '{name}' is named '{spec.name}'", field="services"
            )
    try:
        return dependency_order({n: s.depends_on for n, s in specs.items()})
    except DependencyError as exc:
        raise ConfigError(
            str(exc), field=f"services.{exc.service}.depends_on", allowed=list(specs)
        ) from None
