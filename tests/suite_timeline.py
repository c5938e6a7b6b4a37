"""Where the suite's wall time goes: every test phase with its worker, start and stop.

The suite's budget (25 minutes on 2 cores from a clean clone) is spent by ``-n 3`` xdist
workers over files handed out longest first (tests/conftest.py). ``--durations`` says which
tests are long, not whether the run ended with one worker alone while the others idled, nor
how long a worker waited on another's lock (the real-vLLM studies take turns). With
``AUTOTUNE_TEST_TIMELINE=PATH`` the controlling process writes one JSON line per test phase
(``nodeid``, ``when``, ``worker``, ``start``, ``stop``, ``outcome``) to PATH and prints a
summary at the end: each worker's busy time and finishing time, how long the run ran on fewer
workers than it has, and the files that took longest. ``make test`` sets it
(``.venv-engines/test-timeline.jsonl``); BENCHMARKS.md, "Test suite", reads it.

Each phase also carries the CPU seconds its worker spent (``cpu``: the worker process and the
processes it waited for, by ``os.times()``, measured on the worker and sent with the report).
On 2 cores the suite keeps both busy from start to end, so its wall time is its CPU work over
the cores: the files that cost wall time are the ones that burn CPU, not the ones that wait
(a test that sleeps or waits on a lock is long in the timeline and cheap here). A server that
outlives its test is counted when reaped, in the phase that stops it (a module's fixture: its
last teardown); a grandchild orphaned by a kill is not counted at all. A worker's last teardown
also ends its session's fixtures (the SSH lab's sshd and what ran under it: 116 CPU-s in one
run, put on a file that burns 6.7 alone): that phase is marked ``last`` and its CPU is counted
under SESSION_END, not under the file whose test happened to come last.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ENV = "AUTOTUNE_TEST_TIMELINE"
TOP_FILES = 8
SESSION_END = "(a worker's last teardown: its session's fixtures)"


@dataclass(frozen=True)
class Phase:
    """One phase (setup, call, teardown) of one test, as the controller saw it reported."""

    nodeid: str
    when: str
    worker: str
    start: float
    stop: float
    outcome: str
    cpu: float | None = None
    """CPU seconds of the worker and the processes it reaped during the phase (None: unmeasured)."""
    last: bool = False
    """The worker's last teardown, which ends the session's fixtures too."""

    @property
    def file(self) -> str:
        return self.nodeid.split("::", 1)[0]

    @property
    def cpu_owner(self) -> str:
        """Whose CPU the phase's is: its file's, or the session's at a worker's last teardown."""
        return SESSION_END if self.last else self.file


@dataclass
class Summary:
    """What a timeline says about a run: per worker, busy seconds and the last stop."""

    busy: dict[str, float] = field(default_factory=dict)
    last_stop: dict[str, float] = field(default_factory=dict)
    first_start: float = 0.0
    by_file: dict[str, float] = field(default_factory=dict)
    cpu_by_file: dict[str, float] = field(default_factory=dict)

    @property
    def wall(self) -> float:
        return max(self.last_stop.values(), default=self.first_start) - self.first_start

    @property
    def tail(self) -> float:
        """Seconds between the first worker running out of files and the run's end."""
        stops = sorted(self.last_stop.values())
        return stops[-1] - stops[0] if len(stops) > 1 else 0.0

    def lines(self) -> list[str]:
        out = [f"timeline: {self.wall:,.0f} s of tests on {len(self.busy)} worker(s)"]
        for worker in sorted(self.busy):
            out.append(
                f"  {worker}: busy {self.busy[worker]:,.0f} s, "
                f"done at +{self.last_stop[worker] - self.first_start:,.0f} s"
            )
        out.append(f"  the last {self.tail:,.0f} s ran on fewer workers than the run has")
        longest = sorted(self.by_file.items(), key=lambda kv: -kv[1])[:TOP_FILES]
        out.extend(f"  {seconds:7,.0f} s  {name}" for name, seconds in longest)
        if self.cpu_by_file:
            total = sum(self.cpu_by_file.values())
            out.append(
                f"  CPU: {total:,.0f} s in all (the workers and the processes they reaped); "
                "the files that burn most:"
            )
            heaviest = sorted(self.cpu_by_file.items(), key=lambda kv: -kv[1])[:TOP_FILES]
            out.extend(
                f"  {seconds:7,.0f} s  {100 * seconds / total:4.1f}%  {name}"
                for name, seconds in heaviest
            )
        return out


def summarize(phases: list[Phase]) -> Summary:
    """Busy time and finishing time per worker, and seconds per file (all phases)."""
    summary = Summary()
    if not phases:
        return summary
    summary.first_start = min(p.start for p in phases)
    busy: dict[str, float] = defaultdict(float)
    by_file: dict[str, float] = defaultdict(float)
    cpu_by_file: dict[str, float] = defaultdict(float)
    for phase in phases:
        seconds = max(0.0, phase.stop - phase.start)
        busy[phase.worker] += seconds
        by_file[phase.file] += seconds
        if phase.cpu is not None:
            cpu_by_file[phase.cpu_owner] += phase.cpu
        summary.last_stop[phase.worker] = max(summary.last_stop.get(phase.worker, 0), phase.stop)
    summary.busy = dict(busy)
    summary.by_file = dict(by_file)
    summary.cpu_by_file = dict(cpu_by_file)
    return summary


def read(path: Path) -> list[Phase]:
    """The phases a timeline file holds."""
    return [Phase(**json.loads(line)) for line in path.read_text().splitlines() if line]


CPU_KEY = "suite-timeline-cpu-s"
LAST_KEY = "suite-timeline-last"


def _cpu_seconds() -> float:
    """CPU seconds so far of this process and of every child it has waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class CpuMeter:
    """On whichever process runs the tests (an xdist worker, or the one process of a run
    without xdist): each phase's CPU seconds go into the item's ``user_properties``, which
    the phase's report carries (xdist sends them to the controller with it)."""

    def _measure(self, item: pytest.Item, when: str) -> Iterator[None]:
        before = _cpu_seconds()
        try:
            yield
        finally:
            item.user_properties.append((f"{CPU_KEY}:{when}", _cpu_seconds() - before))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
        yield from self._measure(item, "setup")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        yield from self._measure(item, "call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Iterator[None]:
        if nextitem is None:  # no test follows on this process: the session's fixtures end here
            item.user_properties.append((LAST_KEY, True))
        yield from self._measure(item, "teardown")


def _cpu_of(report: pytest.TestReport) -> float | None:
    key = f"{CPU_KEY}:{report.when}"
    values = [v for k, v in report.user_properties if k == key and isinstance(v, int | float)]
    return float(values[-1]) if values else None


def _is_last(report: pytest.TestReport) -> bool:
    return report.when == "teardown" and any(k == LAST_KEY for k, _ in report.user_properties)


def _worker(report: pytest.TestReport) -> str:
    node: Any = getattr(report, "node", None)  # xdist's WorkerController on the controller
    if node is None:
        return "main"
    return str(getattr(node, "workerinput", {}).get("workerid", "?"))


class Timeline:
    """The plugin: on the controller (or a run without xdist), never on a worker."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.phases: list[Phase] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        start, stop = getattr(report, "start", None), getattr(report, "stop", None)
        if start is None or stop is None:
            return
        self.phases.append(
            Phase(
                report.nodeid,
                report.when,
                _worker(report),
                start,
                stop,
                report.outcome,
                _cpu_of(report),
                _is_last(report),
            )
        )

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("w") as out:
            for phase in self.phases:
                out.write(json.dumps(phase.__dict__) + "\n")
        for line in summarize(self.phases).lines():
            terminalreporter.write_line(line)
        terminalreporter.write_line(f"  (every phase: {self.path})")


def register(config: pytest.Config) -> None:
    """When ``AUTOTUNE_TEST_TIMELINE`` names a file: the timeline on the controller, the CPU
    meter where tests run (on the controller of an xdist run it meets no test)."""
    target = os.environ.get(ENV)
    if not target:
        return
    config.pluginmanager.register(CpuMeter(), "suite-timeline-cpu")
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(Timeline(Path(target)), "suite-timeline")
