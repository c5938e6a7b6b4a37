"""Starting, health-gating and stopping the services of a deployment.

``Launcher.apply(specs)`` restarts only the services whose rendered spec changed, starts
them in dependency order, waits for health, and raises ``LaunchError`` with a
``FailureClass`` read from the log when a start fails; ``ApplyResult.startup`` says where
each start's time went (``ServiceStartup``).
"""

from __future__ import annotations

from autotune.errors import LaunchError
from autotune.failures import Classification, FailureClass, classify_log, explain_fault
from autotune.launch.base import ApplyResult, EventCallback, Launcher
from autotune.launch.local import LocalLauncher
from autotune.launch.managed import ManagedLauncher
from autotune.launch.startup import BEFORE_STAGES, ServiceStartup, StageMark

__all__ = [
    "BEFORE_STAGES",
    "ApplyResult",
    "Classification",
    "EventCallback",
    "FailureClass",
    "LaunchError",
    "Launcher",
    "LocalLauncher",
    "ManagedLauncher",
    "ServiceStartup",
    "StageMark",
    "classify_log",
    "explain_fault",
]
