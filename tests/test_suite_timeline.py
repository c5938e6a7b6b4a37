"""The suite's timeline (tests/suite_timeline.py): a real pytest run under xdist writes every
phase with its worker, and the summary counts busy time and the tail where workers idled."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from suite_timeline import ENV, Phase, read, summarize

TESTS = Path(__file__).resolve().parent


def test_the_summary_counts_busy_time_per_worker_and_the_idle_tail() -> None:
    phases = [
        Phase("a.py::t1", "call", "gw0", 100.0, 110.0, "passed"),
        Phase("a.py::t2", "call", "gw0", 110.0, 112.0, "passed"),
        Phase("b.py::t1", "setup", "gw1", 100.0, 130.0, "passed"),
        Phase("b.py::t1", "call", "gw1", 130.0, 131.0, "failed"),
    ]
    summary = summarize(phases)
    assert summary.busy == {"gw0": 12.0, "gw1": 31.0}
    assert summary.wall == 31.0 and summary.tail == 19.0
    assert summary.by_file == {"a.py": 12.0, "b.py": 31.0}
    lines = summary.lines()
    assert lines[0] == "timeline: 31 s of tests on 2 worker(s)"
    assert "the last 19 s ran on fewer workers" in "\n".join(lines)
    assert summarize([]).wall == 0.0


def test_a_run_under_xdist_writes_every_phase_with_its_worker(tmp_path: Path) -> None:
    project = tmp_path / "p"
    project.mkdir()
    (project / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"
        "from suite_timeline import register\n"
        "def pytest_configure(config):\n    register(config)\n"
    )
    (project / "test_a.py").write_text("import time\ndef test_a():\n    time.sleep(0.3)\n")
    (project / "test_b.py").write_text("def test_b():\n    assert False\n")
    out = tmp_path / "timeline.jsonl"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
         "--dist", "loadfile", str(project)],
        capture_output=True, text=True, timeout=120, cwd=project,
        env={**os.environ, ENV: str(out)},
    )  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr  # test_b fails, as written
    assert "timeline: " in run.stdout and str(out) in run.stdout, run.stdout
    phases = read(out)
    assert {(p.nodeid, p.when) for p in phases} == {
        (f"{name}.py::{name}", when) for name in ("test_a", "test_b")
        for when in ("setup", "call", "teardown")
    }  # fmt: skip
    assert {p.worker for p in phases} == {"gw0", "gw1"}  # one file each (loadfile)
    call = next(p for p in phases if p.nodeid == "test_a.py::test_a" and p.when == "call")
    assert call.stop - call.start >= 0.3
    assert next(p for p in phases if p.when == "call" and "test_b" in p.nodeid).outcome == "failed"
