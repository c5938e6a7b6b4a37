"""The suite's timeline (tests/suite_timeline.py): a real pytest run under xdist writes every
phase with its worker, and the summary counts busy time and the tail where workers idled."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from suite_timeline import ENV, SESSION_END, Phase, read, summarize

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
    assert "CPU: " not in "\n".join(lines)  # no phase measured its CPU: no CPU lines


def test_the_summary_ranks_files_by_the_cpu_they_burnt() -> None:
    phases = [
        Phase("wait.py::t", "call", "gw0", 0.0, 100.0, "passed", cpu=1.0),
        Phase("burn.py::t", "setup", "gw1", 0.0, 20.0, "passed", cpu=30.0),
        Phase("burn.py::t", "call", "gw1", 20.0, 30.0, "passed", cpu=9.0),
        Phase("old.py::t", "call", "gw1", 30.0, 31.0, "passed"),  # unmeasured
    ]
    summary = summarize(phases)
    assert summary.cpu_by_file == {"wait.py": 1.0, "burn.py": 39.0}
    lines = summary.lines()
    start = lines.index(
        "  CPU: 40 s in all (the workers and the processes they reaped); the files that burn most:"
    )
    assert lines[start + 1] == "       39 s  97.5%  burn.py"
    assert lines[start + 2] == "        1 s   2.5%  wait.py"


def test_a_workers_last_teardown_is_the_sessions_cpu_not_its_files() -> None:
    """The teardown that ends a worker's session fixtures (a lab's servers reaped there) is
    counted apart: the file whose test came last burnt only its own call."""
    phases = [
        Phase("early.py::t", "call", "gw0", 0.0, 10.0, "passed", cpu=5.0),
        Phase("late.py::t", "call", "gw0", 10.0, 11.0, "passed", cpu=0.5),
        Phase("late.py::t", "teardown", "gw0", 11.0, 11.5, "passed", cpu=60.0, last=True),
    ]
    summary = summarize(phases)
    assert summary.cpu_by_file == {"early.py": 5.0, "late.py": 0.5, SESSION_END: 60.0}
    assert summary.by_file == {"early.py": 10.0, "late.py": 1.5}  # wall stays the file's
    assert f"  {60:7,.0f} s  {100 * 60 / 65.5:4.1f}%  {SESSION_END}" in summary.lines()


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
    # CPU burnt in a child the test waits for: counted in its phase, unlike test_a's sleep
    (project / "test_c.py").write_text(
        "import subprocess, sys\n"
        "def test_c():\n"
        "    subprocess.run([sys.executable, '-c', "
        "'import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.6: pass'],"
        " check=True)\n"
    )
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
        (f"{name}.py::{name}", when) for name in ("test_a", "test_b", "test_c")
        for when in ("setup", "call", "teardown")
    }  # fmt: skip
    assert {p.worker for p in phases} == {"gw0", "gw1"}  # loadfile: a file stays on one worker
    call = next(p for p in phases if p.nodeid == "test_a.py::test_a" and p.when == "call")
    assert call.stop - call.start >= 0.3
    assert next(p for p in phases if p.when == "call" and "test_b" in p.nodeid).outcome == "failed"
    # every phase carries its CPU seconds; the child's 0.6 s land in test_c's call
    assert all(p.cpu is not None and p.cpu >= 0 for p in phases)
    cpu = {p.nodeid.split(".py")[0]: p.cpu for p in phases if p.when == "call"}
    assert cpu["test_c"] is not None and cpu["test_c"] >= 0.6, cpu
    assert cpu["test_a"] is not None and cpu["test_a"] < 0.3, cpu  # a sleep burns none
    assert "CPU: " in run.stdout and "the files that burn most:" in run.stdout, run.stdout
    heaviest = run.stdout.split("the files that burn most:")[1].splitlines()[1]
    assert heaviest.endswith("test_c.py"), run.stdout
    # each worker's last phase, a teardown, is marked as the end of its session; no other
    for worker in ("gw0", "gw1"):
        own = sorted((p for p in phases if p.worker == worker), key=lambda p: p.stop)
        assert [p.last for p in own] == [False] * (len(own) - 1) + [True], own
        assert own[-1].when == "teardown"
