"""Port claims across processes: two autotune processes on one machine never hand out the
same port, even while neither has bound it yet (the window in which a parallel test run once
failed a trial with ``port_in_use``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from autotune import ports

PICKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from autotune import ports
    claims, band, out, go = (Path(a) for a in sys.argv[1:5])
    ports.CLAIMS_DIR = claims
    ports._PROC_RANGE = band  # 20000..20999: a band of 1,000 ports
    picked = []
    for _ in range(30):
        picked += ports.pick_free_ports("127.0.0.1", 10)
    out.write_text(" ".join(map(str, picked)))
    while not go.exists():  # hold the claims (as a study holds them while it runs)
        time.sleep(0.02)
    """
)


def _wait(paths: list[Path], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"not written: {paths}"
        time.sleep(0.05)


def test_two_processes_never_pick_the_same_port(tmp_path: Path) -> None:
    """300 picks each from a band of 1,000 ports: without claims ~90 would collide."""
    claims = tmp_path / "claims"
    band = tmp_path / "range"
    band.write_text("21000 60999\n")
    go = tmp_path / "go"
    outs = [tmp_path / f"picked-{i}" for i in range(2)]
    procs = [
        subprocess.Popen([sys.executable, "-c", PICKER, str(claims), str(band), str(out), str(go)])
        for out in outs
    ]
    try:
        _wait(outs)
        picked = [set(map(int, out.read_text().split())) for out in outs]
        assert [len(p) for p in picked] == [300, 300]
        assert not picked[0] & picked[1], sorted(picked[0] & picked[1])
        on_disk = {int(p.name) for p in claims.iterdir() if p.name.isdigit()}
        assert on_disk == picked[0] | picked[1]
    finally:
        go.write_text("")
        for proc in procs:
            proc.wait(timeout=60)
    assert [proc.returncode for proc in procs] == [0, 0]
    assert not [p for p in claims.iterdir() if p.name.isdigit()], "claims left at exit"


def test_a_dead_processs_claims_are_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    claims = tmp_path / "claims"
    claims.mkdir(mode=0o700)
    monkeypatch.setattr(ports, "CLAIMS_DIR", claims)
    monkeypatch.setattr(ports, "_OWN_CLAIMS", [])
    (tmp_path / "range").write_text("21000 60999\n")
    monkeypatch.setattr(ports, "_PROC_RANGE", tmp_path / "range")
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(dead.stdout)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # Every port of the band but 50 is claimed by a live process; 10 by a dead one.
        live = [p for p in range(20_000, 21_000) if p % 20]
        for port in live:
            (claims / str(port)).write_text(str(sleeper.pid))
        stale = list(range(20_000, 20_200, 20))
        for port in stale:
            (claims / str(port)).write_text(str(dead_pid))
        picked = ports.pick_free_ports("127.0.0.1", 5)
        assert not set(picked) & set(live), picked
        assert all((claims / str(p)).read_text() == str(os.getpid()) for p in picked)
        assert not any((claims / str(p)).exists() for p in stale if p not in picked), (
            "a dead process's claims stayed"
        )
        ports.release_claims()
        assert not any((claims / str(p)).exists() for p in picked)
        assert all((claims / str(p)).exists() for p in live), "another process's claims went"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_symlinked_claims_dir_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A planted link (``/tmp`` is shared) must not make autotune write where it points."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "claims"
    link.symlink_to(target)
    monkeypatch.setattr(ports, "CLAIMS_DIR", link)
    picked = ports.pick_free_ports("127.0.0.1", 3)
    assert len(set(picked)) == 3
    assert not list(target.iterdir())


def test_claims_that_cannot_be_kept_never_fail_a_pick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claims directory that cannot be created (a file in the way: as a read-only or full
    file system would refuse it): the pick falls back to the bind check alone."""
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(ports, "CLAIMS_DIR", tmp_path / "file" / "claims")
    picked = ports.pick_free_ports("127.0.0.1", 3)
    assert len(set(picked)) == 3 and all(ports.is_port_free("127.0.0.1", p) for p in picked)
