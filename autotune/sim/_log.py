"""The simulated server's log: SGLang-like lines on stdout (info) and stderr (errors).

Separate from ``server`` because every part of the server writes through it (the start-up
sequence, the engine's batch lines, the request handlers' errors) and it needs nothing
else of the server: the lowest of the server's modules.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import datetime

from autotune.sim.args import SimConfig


def _now() -> str:
    return datetime.now().strftime("%Y-%m-%d %H:%M:%S")


class Log:
    """SGLang-like log lines on stdout (info) and stderr (errors), flushed at once."""

    def __init__(self, cfg: SimConfig) -> None:
        self.quiet = cfg.log_level in ("warning", "error", "critical")

    def info(self, msg: str, *, tp: bool = False) -> None:
        if not self.quiet:
            sys.stdout.write(f"[{_now()}{' TP0' if tp else ''}] {msg}\n")
            sys.stdout.flush()

    def warning(self, msg: str) -> None:
        if not self.quiet:
            sys.stdout.write(f"[{_now()}] WARNING: {msg}\n")
            sys.stdout.flush()

    def error_lines(self, lines: Sequence[str]) -> None:
        sys.stderr.write(
            "".join(f"[{_now()} TP0] {ln}\n" if i == 0 else f"{ln}\n" for i, ln in enumerate(lines))
        )
        sys.stderr.flush()
