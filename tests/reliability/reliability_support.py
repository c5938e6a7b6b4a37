"""Running ``autotune run`` as a real process with fail points, and checking the study after.

The checks are the promises of RELIABILITY.md: whatever happened, the SQLite file passes
``PRAGMA integrity_check``, trial numbers run 0..n-1 without gap or repeat, no trial is left
RUNNING once a run has finished, every FAIL trial says why and (when it had a config) its
config was enqueued again, and no service process started by autotune outlives the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import optuna
from e2e_helpers import E2E_STUDY
from optuna.trial import FrozenTrial, TrialState

STUDY = "rel"


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    fired: list[tuple[str, float]]
    """(fail point, time.time()) for each fail point that fired."""
    ended_at: float


def run_cli(
    tmp_path: Path,
    *args: str,
    failpoints: str = "",
    storage: str | None = None,
    study_file: Path = E2E_STUDY,
    timeout: float = 180,
    extra_env: dict[str, str] | None = None,
) -> Run:
    """``autotune run ARGS`` in ``tmp_path`` (the study's working directory), to the end."""
    t0 = time.monotonic()
    proc = start_cli(
        tmp_path,
        *args,
        failpoints=failpoints,
        storage=storage,
        study_file=study_file,
        extra_env=extra_env,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    ended = time.time()
    log = tmp_path / "failpoints.log"
    fired = []
    if log.exists():
        for line in log.read_text().splitlines():
            name, when = line.split()
            fired.append((name, float(when)))
    return Run(proc.returncode, out, err, time.monotonic() - t0, fired, ended)


def db_path(tmp_path: Path) -> Path:
    return tmp_path / "rel.db"


def integrity(db: Path) -> str:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return str(con.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        con.close()


def trials_of(db: Path) -> list[FrozenTrial]:
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{db}")
    return study.get_trials(deepcopy=False)


def assert_consistent(db: Path, *, finished: bool = True) -> list[FrozenTrial]:
    """The study invariants; ``finished``: no run is in progress (none may be RUNNING)."""
    assert integrity(db) == "ok"
    trials = trials_of(db)
    numbers = [t.number for t in trials]
    assert numbers == list(range(len(trials))), f"trial numbers lost or repeated: {numbers}"
    if finished:
        assert not [t.number for t in trials if t.state == TrialState.RUNNING]
    retried = {t.user_attrs.get("retry_of") for t in trials}
    for t in trials:
        if t.state == TrialState.FAIL:
            assert t.user_attrs.get("failure") and t.user_attrs.get("reason"), t.user_attrs
            enqueued = t.params or t.system_attrs.get("fixed_params")
            if enqueued:
                assert t.number in retried, f"FAIL trial #{t.number} was not retried"
        if t.state == TrialState.COMPLETE:
            assert "config" in t.user_attrs and "failure" in t.user_attrs
            assert t.values is not None
    baselines = [
        t for t in trials if t.state == TrialState.COMPLETE and t.user_attrs.get("is_baseline")
    ]
    assert len(baselines) <= 1, "the baseline was measured twice"
    return trials


def service_pids(run_dir: Path) -> dict[str, int]:
    """Pids of the services recorded in the local launcher's state file(s)."""
    pids: dict[str, int] = {}
    for state in run_dir.rglob("state.json"):
        data = json.loads(state.read_text())
        for name, svc in data.get("services", {}).items():
            pids[name] = int(svc["pid"])
    return pids


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def kill_all(pids: dict[str, int]) -> None:
    """Clean up after a test that failed before the tuner could."""
    for pid in pids.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def processes_with_marker(marker: str) -> list[int]:
    """Pids whose environment holds ``AUTOTUNE_TEST_MARKER=marker`` (the tuner's descendants:
    every service autotune started inherits it)."""
    needle = f"AUTOTUNE_TEST_MARKER={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes() and alive(int(entry.name)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def start_cli(
    tmp_path: Path,
    *args: str,
    failpoints: str = "",
    storage: str | None = None,
    study_file: Path = E2E_STUDY,
    extra_env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    """Like :func:`run_cli` but returns at once, to act on the running process."""
    log = tmp_path / "failpoints.log"
    log.unlink(missing_ok=True)
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "COLUMNS": "200",
        "AUTOTUNE_FAILPOINTS": failpoints,
        "AUTOTUNE_FAILPOINTS_LOG": str(log),
        **(extra_env or {}),
    }
    url = storage or f"sqlite:///{tmp_path / 'rel.db'}"
    cmd = [sys.executable, "-m", "autotune", "run", "--study", STUDY, "--storage", url]
    cmd += ["--study-file", str(study_file), *args]
    return subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_fired(
    tmp_path: Path, point: str, proc: subprocess.Popen[str], timeout: float = 90
) -> None:
    """Block until the fail point ``point`` fired in ``proc`` (fails if it exits first)."""
    log = tmp_path / "failpoints.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and any(
            line.startswith(point + " ") for line in log.read_text().splitlines()
        ):
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"exited {proc.returncode} before {point}:\n{out}\n{err}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"fail point {point} never fired")
