"""Helpers of the fault tests: start ``faulty_server.py`` for real, time a call."""

from __future__ import annotations

import select
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SCRIPT = Path(__file__).with_name("faulty_server.py")
DRIP_INTERVAL_S = 0.2
"""Fast drip so that short timeouts still see several bytes (a per-read timeout never fires)."""
TIMEOUT_S = 0.6
"""Request timeout of the tests: > the drip interval, small enough for a fast suite."""


@dataclass
class Served:
    url: str
    proc: subprocess.Popen[bytes]

    def alive(self) -> bool:
        return self.proc.poll() is None


StartServer = Callable[..., Served]


def start(
    fault: str = "ok", *, after: int = 0, scope: str = "completions", ready_delay: float = 0.0
) -> Served:
    argv = [sys.executable, str(SCRIPT), "--host", "127.0.0.1", "--port", "0"]
    argv += ["--fault", fault, "--fault-after", str(after), "--fault-scope", scope]
    argv += ["--ready-delay", str(ready_delay), "--drip-interval", str(DRIP_INTERVAL_S)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 10.0)
    line = proc.stdout.readline().decode() if ready else ""
    if not line.startswith("listening on "):
        proc.kill()
        proc.wait()
        raise AssertionError(f"faulty_server.py did not start (rc={proc.poll()}, {line!r})")
    return Served(line.split()[-1], proc)


class Timer:
    """``with Timer() as t: ...; t.seconds``."""

    seconds = 0.0

    def __enter__(self) -> Timer:
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.monotonic() - self._t0
