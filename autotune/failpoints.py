"""Named fault-injection points, armed only by the ``AUTOTUNE_FAILPOINTS`` variable.

The reliability tests (RELIABILITY.md) kill or interrupt a real ``autotune run`` process at
an exact phase of a trial; timing a signal from outside cannot hit "between two storage
writes" reliably. Unset (always, outside tests) a fail point costs one dictionary lookup.

``AUTOTUNE_FAILPOINTS="storage.mid=kill,measure=sigint"``: each entry ``POINT=ACTION``, where
ACTION is ``kill`` (SIGKILL to this process: nothing runs afterwards, like ``kill -9``),
``sigint`` / ``sigterm`` (a real signal to this process, handled like Ctrl-C / systemctl
stop), ``raise`` (an ``OSError``, as a failing disk would raise) or ``sleep:SECONDS``.
Points are listed in :data:`POINTS`; an unknown point or action is an error, so a typo in a
test cannot silently test nothing. ``AUTOTUNE_FAILPOINTS_LOG=FILE`` appends ``POINT TIME`` to
FILE (synced) each time an armed point fires, so a test can prove it hit the phase and time
how long the process took to stop after it.
"""

from __future__ import annotations

import os
import signal
import time

from autotune.errors import ConfigError

ENV = "AUTOTUNE_FAILPOINTS"
LOG_ENV = "AUTOTUNE_FAILPOINTS_LOG"
POINTS = (
    "trial.asked",  # the trial exists in storage, nothing launched yet
    "restart.starting",  # a service process was just started (not yet healthy)
    "restart.ready",  # a service just became healthy
    "probe",  # before the correctness probe
    "warmup",  # warm-up requests are about to run
    "measure",  # the first measured request finished, others are in flight
    "journal.saved",  # the outcome is in the local journal, not yet in storage
    "storage.mid",  # some attributes of the trial are written, its state is not
    "trial.told",  # the trial is COMPLETE in storage
    "retry.enqueued",  # an unscored trial's retry is enqueued, the trial not yet FAIL
    "winddown",  # the run is about to stop its services (a second Ctrl-C lands here)
)
ACTIONS = ("kill", "sigint", "sigterm", "raise", "sleep:SECONDS")

_parsed: tuple[str, dict[str, str]] = ("", {})


def _armed() -> dict[str, str]:
    global _parsed
    text = os.environ.get(ENV, "")
    if text == _parsed[0]:
        return _parsed[1]
    table: dict[str, str] = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        point, _, action = entry.partition("=")
        if point not in POINTS:
            raise ConfigError(f"unknown fail point {point!r}", field=ENV, allowed=POINTS)
        if action not in ("kill", "sigint", "sigterm", "raise") and not action.startswith("sleep:"):
            raise ConfigError(f"unknown action {action!r}", field=ENV, allowed=ACTIONS)
        table[point] = action
    _parsed = (text, table)
    return table


def failpoint(name: str) -> None:
    """Do what ``AUTOTUNE_FAILPOINTS`` says for ``name`` (usually nothing)."""
    armed = _armed()
    if not armed:
        return
    action = armed.get(name)
    if action is None:
        return
    log = os.environ.get(LOG_ENV)
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"{name} {time.time():.6f}\n")
            fh.flush()
            os.fsync(fh.fileno())
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "sigint":
        os.kill(os.getpid(), signal.SIGINT)
    elif action == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    elif action == "raise":
        raise OSError(28, f"fail point {name}: injected I/O error")
    else:
        time.sleep(float(action.split(":", 1)[1]))
