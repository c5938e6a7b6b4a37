"""Several ``autotune run`` workers on one study in a real PostgreSQL server.

Each worker is a real process driving its own simulated deployment (its own servers on their
own ports). One is killed with SIGKILL in the middle of a trial; the study must still reach
its trial count with no configuration measured twice and no trial lost, and the dead
worker's trial must be failed with the reason and its configuration measured by another.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import FrozenTrial, TrialState
from pg_server import PostgresServer, skip_or_fail_if_missing
from reliability.reliability_support import alive, processes_with_marker

from autotune.ports import pick_free_port
from autotune.results import load_remeasurements
from autotune.study.workers import TRIAL_WORKER_ATTR, read_workers

REPO = Path(__file__).resolve().parents[2]
STUDY = "shared"


def _study_file(tmp_path: Path, *, lease_s: float = 4.0) -> Path:
    data = yaml.safe_load((REPO / "tests" / "data" / "e2e-study.yaml").read_text())
    data["space"] = str(REPO / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml")
    data["deployment"] = str(REPO / "launchers" / "sim-dsv4-flash-pd.yaml")
    data["workers"] = {"heartbeat_s": 0.5, "lease_s": lease_s}
    data["remeasure"] = {"top_k": 2, "repeats": 1}
    path = tmp_path / "shared.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _log_path(tmp_path: Path, name: str) -> Path:
    """Where worker ``name`` writes its output."""
    return tmp_path / f"{name.replace('/', '_')}.log"


def _worker(
    tmp_path: Path,
    url: str,
    study_file: Path,
    name: str,
    trials: int,
    marker: str,
    *extra: str,
) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "COLUMNS": "200",
        "AUTOTUNE_TEST_MARKER": marker,
    }
    cmd = [sys.executable, "-m", "autotune", "run", "--study", STUDY, "--storage", url]
    cmd += ["--study-file", str(study_file), "--worker", name, "--trials", str(trials), *extra]
    log = _log_path(tmp_path, name).open("a")
    return subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, text=True
    )


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    skip_or_fail_if_missing()
    with PostgresServer() as pg:
        yield pg


def _load(url: str) -> optuna.Study:
    return optuna.load_study(study_name=STUDY, storage=url)


def _measured_configs(trials: list[FrozenTrial]) -> Counter[str]:
    """Configurations launched and measured (not reused, not refused before launch)."""
    return Counter(
        json.dumps(t.user_attrs["config"], sort_keys=True)
        for t in trials
        if t.state == TrialState.COMPLETE
        and t.user_attrs.get("reused_from") is None
        and t.user_attrs.get("failure") != "forbidden"
    )


def _wait_phase(
    url: str,
    name: str,
    *,
    after_done: int,
    timeout: float,
    proc: subprocess.Popen[str],
    tmp_path: Path,
) -> int:
    """Wait until worker ``name`` is in the middle of a trial (launching, probing or loading
    its deployment: the phase its record showed at its last beat) after ``after_done``
    trials; that trial's number. A worker that exits first, or never gets there, fails the
    test with its last record and its log's end."""
    deadline = time.monotonic() + timeout
    record = None
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            record = read_workers(_load(url)).get(name)
        except KeyError:
            record = None
        if (
            record is not None
            and record.done >= after_done
            and record.phase not in (None, "ask", "store")
            and record.trial is not None
        ):
            return record.trial
        time.sleep(0.1)
    log = _log_path(tmp_path, name)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
    status = "still running" if proc.poll() is None else f"exited with {proc.returncode}"
    raise AssertionError(
        f"worker {name} was never seen in the middle of a trial after {after_done} done "
        f"({status}); its last record: {record!r}; its log ends:\n{tail}"
    )


def _held_trial(url: str, name: str, seen: int) -> int:
    """The trial worker ``name`` holds RUNNING, read once it is stopped (killed or frozen).

    ``_wait_phase`` reads the phase as of the worker's last beat (every 0.5 s): the trial
    it saw may have ended (a start-up failure takes 0.3 s) and the next one begun before
    the signal landed; the trial that was cut off is the one left RUNNING."""
    held = [
        t.number
        for t in _load(url).get_trials(deepcopy=False)
        if t.state == TrialState.RUNNING and t.system_attrs.get(TRIAL_WORKER_ATTR) == name
    ]
    assert len(held) == 1, f"worker {name} held {held} when stopped (seen on #{seen})"
    return held[0]


def _finish(procs: list[subprocess.Popen[str]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise


def test_three_workers_one_killed_reach_the_count_without_duplicates_or_losses(
    server: PostgresServer, tmp_path: Path
) -> None:
    url = server.url(server.create_database())
    study_file = _study_file(tmp_path)
    marker = f"multiworker-{os.getpid()}-{time.time_ns()}"
    # Enough trials that w1 and w3 still ask for new ones once w2's lease (4 s) has run out
    # after the kill: w2 is killed in its second trial, when the others have done ~6 (many
    # refused before launch in no time); with 16, 2 of 6 runs here saw them reach the count
    # first, and w2's own restart, not a live worker, settled its trial (as interrupted).
    trials = 24
    # w3 drives a deployment of its own (--deployment), the others the study file's.
    own = yaml.safe_load((REPO / "launchers" / "sim-dsv4-flash-pd.yaml").read_text())
    own["name"] = "sim-node-b"
    own_file = tmp_path / "node-b.yaml"
    own_file.write_text(yaml.safe_dump(own))
    extra = {"w1": (), "w2": (), "w3": ("--deployment", str(own_file))}
    procs = {n: _worker(tmp_path, url, study_file, n, trials, marker, *extra[n]) for n in extra}
    try:
        victim = _wait_phase(
            url, "w2", after_done=1, timeout=240, proc=procs["w2"], tmp_path=tmp_path
        )
        procs["w2"].send_signal(signal.SIGKILL)
        procs["w2"].wait(timeout=10)
        victim = _held_trial(url, "w2", victim)
        killed_at = time.monotonic()
        _finish([procs["w1"], procs["w3"]], timeout=400)
        assert procs["w1"].returncode == 0 and procs["w3"].returncode == 0, (
            (tmp_path / "w1.log").read_text()[-3000:],
            (tmp_path / "w3.log").read_text()[-3000:],
        )
        # The dead worker's servers outlive it; the same worker name, started again,
        # stops them and finds nothing left to do.
        again = _worker(tmp_path, url, study_file, "w2", trials, marker)
        _finish([again], timeout=120)
        assert again.returncode == 0, (tmp_path / "w2.log").read_text()[-3000:]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    assert processes_with_marker(marker) == []

    study = _load(url)
    all_trials = study.get_trials(deepcopy=False)
    complete = [t for t in all_trials if t.state == TrialState.COMPLETE]
    assert len(complete) >= trials
    assert len(complete) <= trials + 2  # at most one in flight per other worker at the end
    assert [t.number for t in all_trials] == list(range(len(all_trials)))
    assert not [t.number for t in all_trials if t.state == TrialState.RUNNING]
    # Every worker did some of the work; the killed one's trial is failed with the reason.
    owners = Counter(t.system_attrs.get(TRIAL_WORKER_ATTR) for t in complete)
    assert owners["w1"] > 0 and owners["w3"] > 0 and owners["w2"] > 0, owners
    lost = all_trials[victim]
    assert lost.state == TrialState.FAIL
    assert lost.user_attrs["failure"] == "worker_lost"
    assert "w2" in lost.user_attrs["reason"] and "heartbeat" in lost.user_attrs["reason"]
    # No configuration measured twice; the lost one measured by another worker.
    measured = _measured_configs(all_trials)
    assert [c for c, n in measured.items() if n > 1] == []
    lost_config = json.dumps(
        next(t for t in all_trials if t.user_attrs.get("retry_of") == victim).params,
        sort_keys=True,
    )
    retried = [t for t in complete if t.user_attrs.get("retry_of") == victim]
    assert len(retried) == 1 and retried[0].system_attrs.get(TRIAL_WORKER_ATTR) != "w2"
    assert json.dumps(retried[0].params, sort_keys=True) == lost_config
    # Every FAIL trial says why; the ones with a config were retried.
    retried_of = {t.user_attrs.get("retry_of") for t in all_trials}
    for t in all_trials:
        if t.state == TrialState.FAIL:
            assert t.user_attrs.get("failure") in {"worker_lost", "claimed", "interrupted"}
            if t.user_attrs["failure"] != "claimed" and t.params:
                assert t.number in retried_of
    # Re-measurements: each (trial, repeat) once, whoever ran it.
    remeasured = Counter((m.of, m.repeat) for m in load_remeasurements(study))
    assert remeasured and max(remeasured.values()) == 1
    # One race, one budget (top_k 2 x repeats 1 = 2 restarts) for all the workers: each
    # counts what the others claimed; two deciding in the same instant may add one.
    assert len(remeasured) <= 3, remeasured
    records = read_workers(study)
    assert {n: r.state for n, r in records.items() if r is not None} == {
        "w1": "stopped",
        "w2": "stopped",
        "w3": "stopped",
    }
    # `autotune status` shows the three workers and the counts from the shared study.
    shown = subprocess.run(
        [sys.executable, "-m", "autotune", "status", "--study", STUDY, "--storage", url, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert sorted(w["name"] for w in status["workers"]) == ["w1", "w2", "w3"]
    assert {w["name"]: w["deployment"] for w in status["workers"]} == {
        "w1": "sim-dsv4-flash-pd",
        "w2": "sim-dsv4-flash-pd",
        "w3": "sim-node-b",
    }
    assert {w["liveness"] for w in status["workers"]} == {"stopped"}
    assert sum(w["done"] for w in status["workers"]) == len(complete)
    assert status["duplicate_configs"] == 0
    table = subprocess.run(
        [sys.executable, "-m", "autotune", "status", "--study", STUDY, "--storage", url],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "120"},
    )
    assert table.returncode == 0 and "w2" in table.stdout and "stopped" in table.stdout
    # best, report and the exports read the shared study as they read SQLite.
    for args in (
        ["best"],
        ["report", "--out", str(tmp_path / "report.html")],
        ["best", "--export", "systemd", "--out", str(tmp_path / "units")],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "autotune", *args, "--study", STUDY, "--storage", url],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert done.returncode == 0, (args, done.stderr)
    assert (tmp_path / "report.html").stat().st_size > 10_000
    assert len(list((tmp_path / "units").rglob("*.service"))) == 3
    # The lease (4 s) bounded how long the lost trial waited.
    text = (tmp_path / "w1.log").read_text() + (tmp_path / "w3.log").read_text()
    assert f"trial #{victim} failed as worker_lost" in text
    assert time.monotonic() - killed_at > 0
    assert not any(alive(p) for p in processes_with_marker(marker))


def test_workers_ride_out_a_database_restart(server: PostgresServer, tmp_path: Path) -> None:
    url = server.url(server.create_database())
    study_file = _study_file(tmp_path, lease_s=30.0)
    marker = f"multiworker-db-{os.getpid()}-{time.time_ns()}"
    # Forbidden proposals finish in no time: with 12 trials, worker b once drew enough of
    # them to fill the study while a was still on its second trial (a clean-clone run,
    # 2026-12-05). 16 trials, and a is caught in any trial after its first.
    trials = 16
    procs = [_worker(tmp_path, url, study_file, n, trials, marker) for n in ("a", "b")]
    try:
        _wait_phase(url, "a", after_done=1, timeout=240, proc=procs[0], tmp_path=tmp_path)
        server.restart(down_s=4.0)
        _finish(procs, timeout=400)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    logs = (tmp_path / "a.log").read_text() + (tmp_path / "b.log").read_text()
    assert [p.returncode for p in procs] == [0, 0], logs[-4000:]
    assert "lost the database" in logs
    study = _load(url)
    all_trials = study.get_trials(deepcopy=False)
    complete = [t for t in all_trials if t.state == TrialState.COMPLETE]
    assert trials <= len(complete) <= trials + 1
    assert not [t.number for t in all_trials if t.state == TrialState.RUNNING]
    assert [c for c, n in _measured_configs(all_trials).items() if n > 1] == []
    for t in complete:
        assert "config" in t.user_attrs and t.values is not None
    assert processes_with_marker(marker) == []


def test_dashboard_serves_a_study_in_postgresql(server: PostgresServer, tmp_path: Path) -> None:
    import httpx

    url = server.url(server.create_database())
    study = optuna.create_study(study_name="dash", storage=url)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    port = pick_free_port()
    serve = (
        "import sys; from autotune.dashboard import serve_dashboard; "
        "serve_dashboard(sys.argv[1], port=int(sys.argv[2]), artifact_dir=sys.argv[3])"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", serve, url, str(port), str(tmp_path / "artifacts")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            try:
                got = httpx.get(f"http://127.0.0.1:{port}/api/studies", timeout=2)
                if got.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "dashboard did not answer within 30 s"
            time.sleep(0.2)
        names = [x["study_name"] for x in got.json()["study_summaries"]]
        assert names == ["dash"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_frozen_worker_is_taken_over_and_carries_on(
    server: PostgresServer, tmp_path: Path
) -> None:
    """A worker frozen past the lease (SIGSTOP: a paused VM, a long stall) loses its trial to
    another worker; resumed, it drops that measurement and goes on: nothing twice."""
    url = server.url(server.create_database())
    study_file = _study_file(tmp_path, lease_s=3.0)
    marker = f"multiworker-stop-{os.getpid()}-{time.time_ns()}"
    trials = 16
    procs = {n: _worker(tmp_path, url, study_file, n, trials, marker) for n in ("a", "b")}
    try:
        frozen = _wait_phase(
            url, "a", after_done=1, timeout=240, proc=procs["a"], tmp_path=tmp_path
        )
        procs["a"].send_signal(signal.SIGSTOP)
        frozen = _held_trial(url, "a", frozen)
        deadline = time.monotonic() + 60
        while _load(url).trials[frozen].state == TrialState.RUNNING:
            assert time.monotonic() < deadline, "the frozen worker's trial was never taken over"
            time.sleep(0.2)
        procs["a"].send_signal(signal.SIGCONT)
        _finish(list(procs.values()), timeout=400)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
    logs = (tmp_path / "a.log").read_text()
    assert [p.returncode for p in procs.values()] == [0, 0], logs[-3000:]
    study = _load(url)
    all_trials = study.get_trials(deepcopy=False)
    lost = all_trials[frozen]
    assert lost.state == TrialState.FAIL and lost.user_attrs["failure"] == "worker_lost"
    assert f"trial #{frozen} was taken over by another worker" in logs
    assert [c for c, n in _measured_configs(all_trials).items() if n > 1] == []
    assert not [t.number for t in all_trials if t.state == TrialState.RUNNING]
    assert processes_with_marker(marker) == []
