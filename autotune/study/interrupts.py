"""Ctrl-C and SIGTERM during a study: never half a storage write, always a clean stop.

SIGTERM takes the same path as Ctrl-C (:func:`sigterm_as_interrupt`). Storage writes run
inside :func:`deferred_interrupts`: a signal that arrives there takes effect right after the
write, so a trial is stored whole or not at all, and a database retry in progress stops
waiting (:data:`INTERRUPT_PENDING`). Signal handlers exist in the main thread only; elsewhere
both are no-ops.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

INTERRUPT_PENDING = threading.Event()
"""Ctrl-C/SIGTERM arrived inside a deferred block (see :func:`deferred_interrupts`)."""


@contextmanager
def _handling(sigs: tuple[signal.Signals, ...], handler: Any) -> Iterator[None]:
    """``handler`` for ``sigs`` during the block (signals exist in the main thread only)."""
    try:
        previous = {sig: signal.signal(sig, handler) for sig in sigs}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def sigterm_as_interrupt() -> AbstractContextManager[None]:
    """SIGTERM takes the same clean path as Ctrl-C."""
    return _handling((signal.SIGTERM,), _raise_interrupt)


@contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Ctrl-C/SIGTERM inside the block take effect right after it.

    Wraps storage writes, so an interrupt never leaves a trial half-written; each write is
    short, so the user still sees the run stop within a second.
    """
    received: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        received.append(signum)
        INTERRUPT_PENDING.set()  # a database retry inside the block stops waiting

    with _handling((signal.SIGINT, signal.SIGTERM), hold):
        yield
    if received:
        INTERRUPT_PENDING.clear()
        raise KeyboardInterrupt
