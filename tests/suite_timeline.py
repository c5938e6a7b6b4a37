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
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ENV = "AUTOTUNE_TEST_TIMELINE"
TOP_FILES = 8


@dataclass(frozen=True)
class Phase:
    """One phase (setup, call, teardown) of one test, as the controller saw it reported."""

    nodeid: str
    when: str
    worker: str
    start: float
    stop: float
    outcome: str

    @property
    def file(self) -> str:
        return self.nodeid.split("::", 1)[0]


@dataclass
class Summary:
    """What a timeline says about a run: per worker, busy seconds and the last stop."""

    busy: dict[str, float] = field(default_factory=dict)
    last_stop: dict[str, float] = field(default_factory=dict)
    first_start: float = 0.0
    by_file: dict[str, float] = field(default_factory=dict)

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
        return out


def summarize(phases: list[Phase]) -> Summary:
    """Busy time and finishing time per worker, and seconds per file (all phases)."""
    summary = Summary()
    if not phases:
        return summary
    summary.first_start = min(p.start for p in phases)
    busy: dict[str, float] = defaultdict(float)
    by_file: dict[str, float] = defaultdict(float)
    for phase in phases:
        seconds = max(0.0, phase.stop - phase.start)
        busy[phase.worker] += seconds
        by_file[phase.file] += seconds
        summary.last_stop[phase.worker] = max(summary.last_stop.get(phase.worker, 0), phase.stop)
    summary.busy = dict(busy)
    summary.by_file = dict(by_file)
    return summary


def read(path: Path) -> list[Phase]:
    """The phases a timeline file holds."""
    return [Phase(**json.loads(line)) for line in path.read_text().splitlines() if line]


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
            Phase(report.nodeid, report.when, _worker(report), start, stop, report.outcome)
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
    """Add the plugin when ``AUTOTUNE_TEST_TIMELINE`` names a file, on the controller only."""
    target = os.environ.get(ENV)
    if target and not hasattr(config, "workerinput"):
        config.pluginmanager.register(Timeline(Path(target)), "suite-timeline")
