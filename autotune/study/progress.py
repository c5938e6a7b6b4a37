"""What the user sees while a study runs: trial n/N, phase, this trial's result, best so far.

Everything shown passes through :func:`autotune.secrets.scrub_text` (failure reasons and
messages can quote a command line, a server's log or a storage URL with its password): a
terminal, a CI log or a pipe keeps no credential.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Protocol

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from autotune.secrets import scrub_text


class ProgressSink(Protocol):
    """Receives the loop's events; the loop never prints itself."""

    def trial_started(
        self,
        *,
        number: int,
        index: int,
        total: int,
        config: Mapping[str, object],
        kind: str = "trial",
    ) -> None: ...

    def phase(self, name: str) -> None: ...

    def trial_finished(self, report: TrialReport) -> None: ...

    def message(self, text: str) -> None: ...

    def close(self) -> None: ...


class NullProgress:
    """For tests and library use."""

    def trial_started(self, **_: object) -> None:
        pass

    def phase(self, name: str) -> None:
        pass

    def trial_finished(self, report: TrialReport) -> None:
        pass

    def message(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class TrialReport:
    """How one trial ended, as shown to the user."""

    number: int
    throughput: float | None
    failure: str | None
    reason: str | None
    best: float | None
    best_number: int | None
    seconds: float
    reused_from: int | None
    aborted: bool = False
    """Measured only in part (clearly below the incumbent): the figure is rough."""
    unit: str = "tok/s"
    """The first objective's unit (``req/s`` for capacity and goodput)."""

    def outcome(self) -> str:
        if self.aborted and self.throughput is not None:
            reason = scrub_text(self.reason or "")
            text = f"~{self.throughput:,.1f} {self.unit}, {reason.splitlines()[0][:110]}".rstrip(
                ", "
            )
        elif self.failure:
            reason = scrub_text(self.reason) if self.reason else ""
            short = reason.splitlines()[0][:90] if reason.strip() else ""
            text = f"infeasible [{self.failure}] {short}".rstrip()
        else:
            text = f"{self.throughput:,.1f} {self.unit}" if self.throughput is not None else "-"
        reuse = f" (reused #{self.reused_from})" if self.reused_from is not None else ""
        return f"{text}{reuse} in {self.seconds:.1f}s"

    def best_text(self) -> str:
        return (
            f"{self.best:,.1f} {self.unit} (#{self.best_number})" if self.best is not None else "-"
        )


def _counter(index: int, total: int) -> str:
    """``3/12``; ``3`` where the total is not known ahead (an explanation's runs)."""
    return f"{index}/{total}" if total > 0 else str(index)


class PlainProgress:
    """One line per trial; used when stdout is not a terminal (CI logs, pipes)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream: IO[str] = stream or sys.stdout
        self._phase = ""

    def _print(self, text: str) -> None:
        print(text, file=self._stream, flush=True)

    def trial_started(
        self,
        *,
        number: int,
        index: int,
        total: int,
        config: Mapping[str, object],
        kind: str = "trial",
    ) -> None:
        self._prefix = f"{kind} {_counter(index, total)} (#{number})"

    def phase(self, name: str) -> None:
        self._phase = name

    def trial_finished(self, report: TrialReport) -> None:
        self._print(f"{self._prefix}: {report.outcome()} | best {report.best_text()}")

    def message(self, text: str) -> None:
        self._print(scrub_text(text))

    def close(self) -> None:
        pass


class RichProgress:
    """A live panel: trial n/N, current phase and its elapsed time, last result, best so far."""

    def __init__(self, console: Console | None = None) -> None:
        self._console = console or Console()
        self._live = Live(
            self._render(), console=self._console, refresh_per_second=8, transient=False
        )
        self._index = 0
        self._total = 0
        self._number = 0
        self._phase = "starting"
        self._phase_started = time.monotonic()
        self._last = "-"
        self._best = "-"
        self._live.start()

    def _render(self) -> Table:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold cyan")
        table.add_column()
        index = getattr(self, "_index", 0)
        total = getattr(self, "_total", 0)
        phase = getattr(self, "_phase", "starting")
        started = getattr(self, "_phase_started", time.monotonic())
        table.add_row(
            getattr(self, "_kind", "trial"),
            f"{_counter(index, total)} (#{getattr(self, '_number', 0)})",
        )
        table.add_row("phase", f"{phase} ({time.monotonic() - started:.1f}s)")
        table.add_row("this trial", Text(getattr(self, "_last", "-")))
        table.add_row("best so far", Text(getattr(self, "_best", "-")))
        return table

    def _refresh(self) -> None:
        self._live.update(self._render())

    def trial_started(
        self,
        *,
        number: int,
        index: int,
        total: int,
        config: Mapping[str, object],
        kind: str = "trial",
    ) -> None:
        self._kind = kind
        self._index, self._total, self._number = index, total, number
        self._last = "running"
        self.phase("propose")

    def phase(self, name: str) -> None:
        self._phase = name
        self._phase_started = time.monotonic()
        self._refresh()

    def trial_finished(self, report: TrialReport) -> None:
        self._last = f"#{report.number}: {report.outcome()}"
        self._best = report.best_text()
        counter = _counter(self._index, self._total)
        line = Text(f"{getattr(self, '_kind', 'trial')} {counter}", style="dim")
        line.append(f" {self._last}")  # text from servers and logs: never parsed as markup
        self._console.print(line, highlight=False)
        self._refresh()

    def message(self, text: str) -> None:
        self._console.print(Text(scrub_text(text)), highlight=False)

    def close(self) -> None:
        self._live.stop()


def make_progress(*, quiet: bool = False) -> ProgressSink:
    if quiet:
        return NullProgress()
    if sys.stdout.isatty():
        return RichProgress()
    return PlainProgress()
