"""CPU time the hypervisor took from this machine (Linux ``/proc/stat``'s ``steal``).

On a virtual machine the host may run other guests on this machine's CPUs; the guest's
threads then stop for milliseconds without the guest's scheduler knowing. On the 2-core VM
the tests run on, the late sends of an open loop followed the steal of the same run (27 runs
of a real vLLM at 16-64 req/s: Spearman 0.84 between stolen ticks and sends over 1 ms), so a
result that says its client fell behind also says how much CPU the host took meanwhile.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC_STAT = Path("/proc/stat")


def steal_seconds(path: Path = PROC_STAT) -> float | None:
    """Stolen CPU seconds summed over the machine's CPUs since boot; ``None`` where the
    kernel does not say (not Linux, a kernel without the column)."""
    try:
        first = path.read_text().split("\n", 1)[0].split()
        ticks = int(first[8])
    except (OSError, IndexError, ValueError):
        return None
    if first[0] != "cpu":
        return None
    return ticks / os.sysconf("SC_CLK_TCK")


def steal_share(before: float | None, after: float | None, seconds: float) -> float | None:
    """Share of the machine's CPU time over ``seconds`` of wall time that was stolen."""
    if before is None or after is None or seconds <= 0:
        return None
    cpus = os.cpu_count() or 1
    return max(after - before, 0.0) / (seconds * cpus)
