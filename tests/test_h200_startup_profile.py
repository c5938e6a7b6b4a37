"""`scripts/h200/run.sh profile` and scripts/h200/startup_profile.py: where a vLLM start goes.

The profile is py-spy's, of a real start-up shape: a stand-in for vLLM's API server (its own
module path, run as ``python -m vllm.entrypoints.openai.api_server``) imports, forks an
"engine core" that works for a second, waits for it, then listens; run.sh records it under
py-spy until the port answers, stops it and summarizes. The GPU machine runs the same verb on
the real vLLM (BENCHMARKS.md, "Where a restart goes on the H200").
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from autotune.ports import pick_free_port

REPO = Path(__file__).resolve().parents[1]
RUN_SH = REPO / "scripts" / "h200" / "run.sh"
sys.path.insert(0, str(REPO / "scripts" / "h200"))
import startup_profile  # noqa: E402

PYSPY = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")

# torch's inductor loads each compiled kernel in a `python -c` child whose code spans lines
# and carries quotes and semicolons; py-spy writes such a command line as it is.
LOADER = 'import time\nfrom ctypes import cdll\ncdll.LoadLibrary("libc.so.6"); time.sleep(2.0)'

FAKE_SERVER = """
import argparse, json, os, signal, socket, subprocess, sys, time

def initialize_engine_core(seconds):
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    return n

def wait_for_engine(fd):
    os.read(fd, 1)

def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model"); p.add_argument("--host"); p.add_argument("--port", type=int)
    args = p.parse_args()
    print("mark=%s other=%s" % (os.environ.get("FAKE_MARK"), os.environ.get("FAKE_OTHER")))
    if os.environ.get("FAKE_PIDFILE"):
        with open(os.environ["FAKE_PIDFILE"], "w") as f:
            f.write(str(os.getpid()))
    time.sleep(0.5)
    ready, done = os.pipe()
    if os.fork() == 0:  # the engine core: ready, then serving until the API server is gone
        initialize_engine_core(float(os.environ.get("FAKE_CORE_S", "3.0")))
        subprocess.run([sys.executable, "-c", LOADER_CODE], check=True)
        os.write(done, b"1")
        parent = os.getppid()
        while os.getppid() == parent:
            time.sleep(0.1)
        os._exit(0)
    wait_for_engine(ready)
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((args.host, args.port)); s.listen()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        conn, _ = s.accept(); conn.close()

main()
""".replace("LOADER_CODE", repr(LOADER))


@pytest.fixture
def fake_site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    pkg = site / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (site / "vllm", site / "vllm" / "entrypoints", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(FAKE_SERVER)
    return site


def _profile(site: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`run.sh profile` on the stand-in server, its files in tmp_path/out."""
    done = subprocess.run(
        ["bash", str(RUN_SH), "profile"],
        env={
            **os.environ,
            "STUDY": f"test-profile-{os.getpid()}",
            "OUT": str(tmp_path / "out"),
            "PY": sys.executable,
            "SITE": str(site),
            "PYSPY": PYSPY,
            "PROFILE_MODEL": "/nonexistent/model",
            "PROFILE_PORT": str(pick_free_port()),
            # Not the repository's studies/logs: other tests' stand-in jobs run there.
            "LOGS": str(tmp_path / "logs"),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _unpacked(tmp_path: Path) -> Path:
    """The profile's one archive in $OUT, unpacked: nothing else of it is left there (the
    device call returns 8 files at most)."""
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["startup-profile.tar.gz"]
    files = tmp_path / "profiles"
    with tarfile.open(out / "startup-profile.tar.gz") as tar:
        tar.extractall(files, filter="data")
    return files


@pytest.mark.skipif(not os.access(PYSPY, os.X_OK), reason="py-spy is in the dev dependencies")
def test_the_profile_verb_records_both_processes_and_says_where_the_time_went(
    fake_site: Path, tmp_path: Path
) -> None:
    done = _profile(fake_site, tmp_path)
    out = _unpacked(tmp_path)
    assert re.search(
        r"profiled start \[default\]: \d+ s to listen \(\d+ s with the stop\)", done.stdout
    ), done.stdout
    raw = gzip.decompress((out / "startup-profile.raw.gz").read_bytes()).decode()
    assert "vllm.entrypoints.openai.api_server --model /nonexistent/model" in raw
    report = (out / "startup-profile.md").read_text()
    overview, server, core, loader = report.split("\n## pid ")
    # When each started, from the kernel as the server first listened: the API server, then
    # its engine core 0.5 s later (the loader had ended by then).
    tree = [line.split("\t") for line in (out / "startup-profile.procs").read_text().splitlines()]
    assert [float(at) for _, at, _ in tree][0] == 0.0 and len(tree) == 2, tree
    assert 0.3 <= float(tree[1][1]) <= 3.0 and "api_server" in tree[1][2], tree
    core_pid = int(tree[1][0])
    assert re.search(rf"\| {core_pid} \| {tree[0][0]} \| {float(tree[1][1]):.1f} \|", overview)
    # The loader's command, newlines, quotes and semicolons as they are (py-spy escapes none).
    assert 'cdll.LoadLibrary("libc.so.6"); time.sleep(2.0)`' in loader, report
    # The API server waited on its engine core; the engine core worked for 3 s (py-spy finds a
    # new child by polling: its first second or so may go unseen).
    waited = re.search(r"`wait_for_engine \(vllm/[a-z/_]+\.py\)` \| ([\d.]+)", server)
    worked = re.search(r"`initialize_engine_core \(vllm/[a-z/_]+\.py\)` \| ([\d.]+)", core)
    assert waited and worked, report
    assert 1.5 <= float(worked.group(1)) <= 6.0 and float(waited.group(1)) >= 3.0


@pytest.mark.skipif(not os.access(PYSPY, os.X_OK), reason="py-spy is in the dev dependencies")
def test_one_profiled_start_per_environment_variant(fake_site: Path, tmp_path: Path) -> None:
    """PROFILE_ENVS: `default`, then two variables set for the second start only."""
    done = _profile(
        fake_site, tmp_path, PROFILE_ENVS="default FAKE_MARK=1,FAKE_OTHER=x", FAKE_CORE_S="0.5"
    )
    out = _unpacked(tmp_path)
    said = re.findall(r"profiled start \[([^\]]*)\]: \d+ s to listen \(\d+ s with", done.stdout)
    assert said == ["default", "FAKE_MARK=1,FAKE_OTHER=x"], done.stdout
    first, second = "startup-profile-1-default", "startup-profile-2-FAKE_MARK_1_FAKE_OTHER_x"
    assert "mark=None other=None" in (out / f"{first}.log").read_text()
    assert "mark=1 other=x" in (out / f"{second}.log").read_text()
    for name in (first, second):
        assert (out / f"{name}.raw.gz").stat().st_size > 0
        assert "| pid | parent | started, s | s sampled |" in (out / f"{name}.md").read_text()
        server = (out / f"{name}.procs").read_text().splitlines()[0].split("\t")
        assert server[1] == "0.00" and "vllm.entrypoints.openai.api_server" in server[2]
    assert not (out / "startup-profile.md").exists()


# A py-spy that starts the server, then fails to attach (as under a sandbox without
# process_vm_readv) and exits, leaving its child running.
FAILING_PYSPY = """#!/bin/bash
while [ "$1" != "--" ]; do shift; done
shift
"$@" &
sleep 1
echo "Error: Failed to attach" >&2
exit 1
"""


def test_a_py_spy_that_fails_leaves_no_server_behind(fake_site: Path, tmp_path: Path) -> None:
    pyspy = tmp_path / "py-spy"
    pyspy.write_text(FAILING_PYSPY)
    pyspy.chmod(0o755)
    pidfile = tmp_path / "server.pid"
    port = pick_free_port()
    done = _profile(
        fake_site,
        tmp_path,
        PYSPY=str(pyspy),
        PROFILE_PORT=str(port),
        FAKE_PIDFILE=str(pidfile),
    )
    assert "profiled start [default]: never listened" in done.stdout, done.stdout + done.stderr
    assert "stopping what is left of the profiled start" in done.stdout
    assert "profile failed" in done.stdout
    # what is known of the failed start comes back all the same, in the one archive
    assert "Error: Failed to attach" in (_unpacked(tmp_path) / "startup-profile.log").read_text()
    server = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(server, 0)
    with socket.socket() as s, pytest.raises(OSError):
        s.connect(("127.0.0.1", port))


def test_the_summary_of_py_spy_lines(tmp_path: Path) -> None:
    main = 'process 10:"python -m x";thread (10): MainThread;'
    child = 'process 10:"python -m x";process 11:"python -m x";thread (11);'
    lines = [
        main + "_run_module_as_main (<frozen runpy>:198);"
        "_find_and_load (<frozen importlib._bootstrap>:1176);"
        "<module> (torch/__init__.py:3);load (torch/lib.py:9) 30",
        main + "_run_module_as_main (<frozen runpy>:198);serve (x/main.py:4);wait (x/main.py:8) 10",
        'process 10:"python -m x";thread (12): Thread-1;run (x/bg.py:1) 99',  # not main
        main.rstrip(";") + " 4",  # no frames
        child + "init_core (x/core.py:2) 20",
    ]
    path = tmp_path / "p.raw.gz"
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    procs = startup_profile.summarize(startup_profile.parse(startup_profile.read_lines(path)))
    assert [p.pid for p in procs] == [10, 11]
    parent, core = procs
    assert (parent.samples, parent.no_frames) == (44, 4)
    assert parent.imports == {"torch": 30}
    assert (
        parent.inclusive["load (torch/lib.py)"] == 30 and parent.inclusive["wait (x/main.py)"] == 10
    )
    assert parent.leaves["wait (x/main.py:8)"] == 10
    assert core.samples == 20 and core.inclusive["init_core (x/core.py)"] == 20
    text = startup_profile.markdown(procs, rate=10, top=5)
    assert "## pid 10: 4.4 s" in text and "| torch | 3.0 |" in text and "## pid 11: 2.0 s" in text


def test_a_command_line_over_several_lines_with_quotes_is_one_record(tmp_path: Path) -> None:
    """As vLLM 0.32.0's CPU start wrote it: inductor's kernel loader under the engine core."""
    server = 'process 10:"python -m vllm.entrypoints.openai.api_server --model m";'
    loader = (
        server + 'process 11:"python -c \nimport sys\nif sys.platform != "linux":\n'
        "    import torch  # noqa: F401\nfrom ctypes import cdll\n"
        'cdll.LoadLibrary("/c/k.so");\n";thread (11);'
        "<module> (<string>:6);CDLL.__init__ (ctypes/__init__.py:376) 5"
    )
    text = "\n".join([loader, server + "thread (10): MainThread;serve (x/main.py:4) 7", ""])
    path = tmp_path / "p.raw"
    path.write_text(text)
    procs = startup_profile.summarize(startup_profile.parse(startup_profile.read_lines(path)))
    assert [(p.pid, p.samples) for p in procs] == [(10, 7), (11, 5)]
    assert procs[1].cmd.startswith("python -c \nimport sys\n")
    assert procs[1].cmd.endswith('cdll.LoadLibrary("/c/k.so");\n')
    assert procs[1].leaves == {"CDLL.__init__ (ctypes/__init__.py:376)": 5}
    assert (procs[0].parent, procs[1].parent) == (None, 10)
    started = {10: 0.0}  # the loader had ended when the tree was read: no start time
    overview = startup_profile.markdown(procs, rate=10, top=3, started=started).split("\n## pid")[0]
    assert "| 10 |  | 0.0 | 0.7 | 0.0 | `python -m vllm.entrypoints" in overview
    child_row = '| 11 | 10 |  | 0.5 | 0.0 | `python -c \\nimport sys\\nif sys.platform != "linux'
    assert child_row in overview


def test_a_file_that_is_not_py_spy_raw_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.raw"
    bad.write_text("frame;frame\n")
    assert startup_profile.main([str(bad)]) == 1
    assert f"{bad}: not a py-spy raw line" in capsys.readouterr().err
    good = tmp_path / "good.raw"
    good.write_text('process 1:"x";thread (1): T;f (a.py:1) 3\n')
    procs = tmp_path / "p.procs"
    procs.write_text("1 0.00 x\n")  # spaces, not tabs
    assert startup_profile.main([str(good), "--procs", str(procs)]) == 1
    assert f"{procs}: not a file of --procs-of" in capsys.readouterr().err
    nothing = tmp_path / "empty.raw"
    nothing.write_text('process 1:"x";thread (2): T;f (a.py:1) 3\n')  # no main thread
    assert startup_profile.main([str(nothing)]) == 1
    assert "no main-thread samples" in capsys.readouterr().err


def test_no_profile_while_a_study_runs_on_the_gpu(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (logs / "some-study-run.pid").write_text(str(sleeper.pid))
        done = subprocess.run(
            ["bash", str(RUN_SH), "profile"],
            env={**os.environ, "OUT": str(tmp_path / "out"), "LOGS": str(logs)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        sleeper.kill()
        sleeper.wait()
    assert done.returncode == 0
    assert "not profiled: another job runs (one GPU)" in done.stdout
    assert not (tmp_path / "out" / "startup-profile.tar.gz").exists()
