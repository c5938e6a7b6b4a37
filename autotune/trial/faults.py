"""What broke a deployment that was healthy when its measurement began: the service that
died, or the cause a live service's log names.

Both answers can lag the symptom the load generator saw. A server that crashed resets its
connections a moment before its exit shows; a server that stays up (transformers serve after
its worker thread died of a CUDA OOM) may answer a request with an error before the thread
that broke has logged why, and a pipe or the journal delays the line further. So each is
asked again for a short grace (:data:`DEATH_GRACE_S`) before the trial gets a generic class
(``request_errors``, ``bench_failed``) instead of its cause. Only failed trials wait.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from autotune.errors import LaunchError
from autotune.launch import Classification, Launcher, explain_fault
from autotune.specs import ServiceSpec

FAULT_SCAN_LINES = 2000
"""Log lines searched for the cause of a live server's fault: the traceback of an OOM in a
worker thread can sit under hundreds of access-log lines of the requests that failed after it."""

DEATH_GRACE_S = 2.0
"""How long a fault waits for a service to show that it died or for its log to name the
cause: on a busy machine both come later (the trial is then ``crashed`` or ``cuda_oom``, its
cause, not ``request_errors``)."""

_DEATH_POLL_S = 0.05
_LOG_POLL_S = 0.2  # a log tail over SSH costs a round trip


def death_behind_errors(launcher: Launcher, specs: Mapping[str, ServiceSpec]) -> LaunchError | None:
    """After failed requests: the service that died, once its exit shows (within
    :data:`DEATH_GRACE_S`), or None."""
    end = time.monotonic() + DEATH_GRACE_S
    while time.monotonic() < end:
        time.sleep(_DEATH_POLL_S)
        died = launcher.check_alive(specs)
        if died is not None:
            return died
    return None


def cause_in_logs(
    launcher: Launcher, specs: Mapping[str, ServiceSpec], *, stalled: bool
) -> tuple[LaunchError | None, Classification | None]:
    """The service that died, else the cause the live services' logs name
    (:func:`~autotune.failures.explain_fault`; ``stalled``: the load got no answer in time),
    asked again for up to :data:`DEATH_GRACE_S` while neither shows; ``(None, None)`` when
    the logs never say."""
    end = time.monotonic() + DEATH_GRACE_S
    while True:
        died = launcher.check_alive(specs)
        if died is not None:
            return died, None
        tails = launcher.log_tails(specs, lines=FAULT_SCAN_LINES)
        cause = explain_fault(tails, stalled=stalled)
        if cause is not None or time.monotonic() >= end:
            return None, cause
        time.sleep(_LOG_POLL_S)
