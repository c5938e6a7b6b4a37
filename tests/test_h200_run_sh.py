"""scripts/h200/run.sh's `watch` ends in time to collect within the device call.

The device tool kills a call at its limit; a watch killed before it collects returns nothing,
and the snapshot of that call is lost (2026-12-05: `kit models sweep watch 530` spent 76 s on
the kit and the model before the watch began). Here a background job that outlives the
watch stands in for the study (a ``sleep`` whose pid is the study's pid file, as `start`
writes it), and the call's limit is a few seconds.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUN_SH = REPO / "scripts" / "h200" / "run.sh"


@pytest.fixture
def running_study(tmp_path: Path) -> Iterator[str]:
    """A study name whose background job (a sleep) is running, as `start` leaves it."""
    study = f"test-watch-{os.getpid()}-{time.monotonic_ns()}"
    logs = REPO / "studies" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    sleeper = subprocess.Popen(["sleep", "120"])
    pidfile = logs / f"{study}-run.pid"
    pidfile.write_text(str(sleeper.pid))
    try:
        yield study
    finally:
        sleeper.kill()
        sleeper.wait()
        pidfile.unlink(missing_ok=True)


def _watch(study: str, out: Path, seconds: int, **env: str) -> tuple[str, float]:
    t0 = time.monotonic()
    done = subprocess.run(
        ["bash", str(RUN_SH), "watch", str(seconds)],
        env={**os.environ, "STUDY": study, "OUT": str(out), "PY": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout, time.monotonic() - t0


def test_a_watch_longer_than_the_call_is_cut_to_leave_collect_its_time(
    running_study: str, tmp_path: Path
) -> None:
    out, elapsed = _watch(running_study, tmp_path, 500, CALL_S="16", COLLECT_S="6")
    # 16 - 6 s less what the script spent before the watch, in bash's whole seconds: 10 s, or
    # 9 s when its start fell late in a second or the machine was busy (seen in a full run).
    cut = re.search(r"watch 500 cut to (\d+) s: the call ends at 16 s \(CALL_S\)", out)
    assert cut, out
    assert 7 <= int(cut.group(1)) <= 10
    assert "still running after the watch" in out  # it returned while the job ran on
    assert elapsed < 60  # about 10 s and a collect, not 500 s (headroom for a busy machine)
    assert elapsed >= int(cut.group(1)) - 1


def test_a_watch_within_the_call_is_not_cut(running_study: str, tmp_path: Path) -> None:
    out, elapsed = _watch(running_study, tmp_path, 1)  # the default call limit, 595 s
    assert "cut to" not in out
    assert "still running after the watch" in out
    assert elapsed < 60


def _models_on(
    card: str, study: str, tmp_path: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    """`run.sh models` on a machine whose nvidia-smi names ``card``; its Python fails at once,
    so whatever passes the card check stops at the first step after it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{card}'\n")
    smi.chmod(0o755)
    return subprocess.run(
        ["bash", str(RUN_SH), "models"],
        env={
            **os.environ,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "STUDY": study,
            "OUT": str(tmp_path / "out"),
            "PY": "false",
            "MODELS": "",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("card", "study"),
    [("NVIDIA H100 80GB HBM3", "vllm-h200-moe"), ("NVIDIA H200", "vllm-h100-moe-random")],
)
def test_a_study_refuses_another_card_than_its_own(card: str, study: str, tmp_path: Path) -> None:
    done = _models_on(card, study, tmp_path)
    assert done.returncode == 1
    assert f"this machine has {card}: nothing started" in done.stdout
    assert "models failed" in done.stdout


@pytest.mark.parametrize(
    ("card", "study", "env"),
    [
        ("NVIDIA H200", "vllm-h200-dense", {}),
        ("NVIDIA H100 80GB HBM3", "vllm-h100-moe", {}),
        ("NVIDIA H100 80GB HBM3", "vllm-h200-dense-check", {"CARD": "any"}),
    ],
)
def test_a_study_on_its_own_card_goes_on(
    card: str, study: str, env: dict[str, str], tmp_path: Path
) -> None:
    done = _models_on(card, study, tmp_path, **env)
    assert "nothing started" not in done.stdout
    assert "models failed" in done.stdout  # the step after the card check ran (PY=false)


def _pack(study: str, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(RUN_SH), "pack"],
        env={**os.environ, "STUDY": study, "OUT": str(out), "PY": sys.executable},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_pack_leaves_one_file_per_study_so_two_collects_fit_a_call(tmp_path: Path) -> None:
    """A call returns 8 files at most and `collect` writes 6: packing the first study's
    leaves room for the second's, and a second pack keeps the first."""
    out = tmp_path / "out"
    out.mkdir()
    first = {"a.db": b"db", "a.html": b"<html>", "best.txt": b"best", "run.log": b"log"}
    for name, data in first.items():
        (out / name).write_bytes(data)
    done = _pack("a", out)
    assert done.returncode == 0, done.stderr
    assert "packed 4 files into" in done.stdout
    assert sorted(p.name for p in out.iterdir()) == ["a-collect.tar.gz"]
    with tarfile.open(out / "a-collect.tar.gz") as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert got == first
    for name in ("b.db", "best.txt", "serve-tail.log"):
        (out / name).write_text(name)
    assert _pack("b", out).returncode == 0
    assert sorted(p.name for p in out.iterdir()) == ["a-collect.tar.gz", "b-collect.tar.gz"]
    with tarfile.open(out / "a-collect.tar.gz") as tar:  # the first pack is untouched
        assert sorted(tar.getnames()) == sorted(first)
    nothing = _pack("c", out)
    assert nothing.returncode == 0 and "pack: nothing in" in nothing.stdout
    assert not (out / "c-collect.tar.gz").exists()


def _check(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """`run.sh check` with a Python that only records its arguments (one line per call)."""
    calls = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    fake.chmod(0o755)
    done = subprocess.run(
        ["bash", str(RUN_SH), "check"],
        env={
            **os.environ,
            "STUDY": "vllm-h200-dense-check",
            "OUT": str(tmp_path / "out"),
            "LOGS": str(tmp_path / "logs"),
            "PY": str(fake),
            **env,
        },
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    deadline = time.monotonic() + 30  # `autotune run` starts in the background
    while done.returncode == 0 and time.monotonic() < deadline:
        if calls.is_file() and "-m autotune run" in calls.read_text():
            break
        time.sleep(0.1)
    return done, calls.read_text().splitlines() if calls.is_file() else []


def test_check_repeats_runs_more_rounds_from_a_copy_of_the_study_file(tmp_path: Path) -> None:
    """CHECK_REPEATS=4: the check study's top configurations re-measured 4 times each (the
    H200 session of 2026-12-07 edited the study file on the machine for it), from a copy
    beside the study file whose relative paths still resolve."""
    from autotune.study.definition import load_study_definition

    copy = REPO / "studies" / ".vllm-h200-dense-check-repeats-4.yaml"
    try:
        done, calls = _check(tmp_path, CHECK_REPEATS="4")
        assert done.returncode == 0, done.stdout + done.stderr
        run = next(c for c in calls if "-m autotune run" in c)
        assert run.endswith(
            f"run --study vllm-h200-dense-check --trials 3 --study-file {copy.relative_to(REPO)}"
        ), run
        original = load_study_definition(REPO / "studies" / "vllm-h200-dense-check.yaml")
        more = load_study_definition(copy)
        assert original.remeasure.repeats == 2 and more.remeasure.repeats == 4
        assert more.model_dump(exclude={"remeasure", "source"}) == original.model_dump(
            exclude={"remeasure", "source"}
        )
        assert more.resolve(Path(more.space)) == original.resolve(Path(original.space))
    finally:
        copy.unlink(missing_ok=True)


@pytest.mark.parametrize("bad", ["0", "x", "100", "-1"])
def test_check_repeats_refuses_what_is_not_a_count(bad: str, tmp_path: Path) -> None:
    done, calls = _check(tmp_path, CHECK_REPEATS=bad)
    assert done.returncode != 0
    assert f"CHECK_REPEATS={bad}: expected a number of re-measurements, 1-99" in done.stdout
    assert not any("-m autotune run" in c for c in calls)
