"""CPU placement on the tuner's machine: the load generator's cores and the services' others.

On a machine that runs both the engine and the tuner (a 2-core test box, a GPU host whose
engine spawns busy CPU threads), the OS runs the server in the client's place and an
open-loop schedule slips by milliseconds (BENCHMARKS.md, "Does the open loop keep its
schedule?": p99 send lag 1.9-4.7 ms sharing two cores, 0.4-1 ms with a core apart). A
deployment's ``client_cpus`` keeps cores for the load generator: the thread that measures
runs only there (:func:`pinned`), and local services start on the others
(``taskset -c``, see :func:`autotune.render.render`).

Lists are written as ``taskset -c``, cpusets and systemd's ``CPUAffinity=`` write them:
``0``, ``0,2``, ``4-7,12``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

_ITEM_RX = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")
MAX_CPU = 65535


def parse_cpu_list(text: str) -> frozenset[int]:
    """``"0,2-3"`` -> ``{0, 2, 3}``; ``ValueError`` naming the bad item otherwise."""
    if not text.strip():
        raise ValueError("an empty CPU list (write CPUs as 0, 0,2 or 4-7)")
    cpus: set[int] = set()
    for item in text.split(","):
        m = _ITEM_RX.fullmatch(item)
        if m is None:
            raise ValueError(f"{item.strip()!r} is not a CPU or a range (write 0, 0,2 or 4-7)")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo or hi > MAX_CPU:
            raise ValueError(f"{item.strip()!r} is not a range of CPUs 0..{MAX_CPU} (low-high)")
        cpus.update(range(lo, hi + 1))
    return frozenset(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """``{0, 2, 3}`` -> ``"0,2-3"`` (ranges merged, sorted)."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(set(cpus)):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(_span(run))
        run = [c]
    if run:
        out.append(_span(run))
    return ",".join(out)


def _span(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


def available_cpus() -> frozenset[int]:
    """The CPUs this process may run on (its affinity, not the machine's count)."""
    return frozenset(os.sched_getaffinity(0))


@contextmanager
def pinned(cpus: frozenset[int] | None) -> Iterator[None]:
    """Run the calling *thread* on ``cpus`` for the block, then restore its affinity.

    Linux applies ``sched_setaffinity(0, ...)`` to the calling thread only, so the tuner's
    other threads (heartbeats, the server-metrics scraper) keep every core; threads the
    block starts inherit the mask. ``None``: no change.
    """
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
