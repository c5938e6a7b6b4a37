"""Which addresses a process listens on, read from /proc (Linux), and starting/stopping it."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

LOOPBACK_HEX = "0100007F"
"""127.0.0.1 as /proc/net/tcp writes it (little-endian hex)."""


def listeners(port: int) -> set[str]:
    """Local addresses in LISTEN state on ``port`` (IPv4 and IPv6 tables)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            addr, hexport = fields[1].rsplit(":", 1)
            if fields[3] == "0A" and int(hexport, 16) == port:
                found.add(addr)
    return found


def wait_listening(
    proc: subprocess.Popen[Any], port: int, *, what: str, timeout_s: float = 30
) -> set[str]:
    """Block until ``proc`` listens on ``port``; fail the test if it exits or never does."""
    deadline = time.monotonic() + timeout_s
    while not listeners(port):
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            text = out.decode(errors="replace") if isinstance(out, bytes) else str(out)
            pytest.fail(f"{what} exited early ({proc.returncode}): {text[-2000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not listen on {port} within {timeout_s:g} s")
        time.sleep(0.05)
    return listeners(port)


def stop(proc: subprocess.Popen[Any]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
