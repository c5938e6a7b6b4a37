"""Failure classification, as the launcher package has always exported it.

The implementation lives in :mod:`autotune.failures` (below the launchers and the service
managers, which both classify logs); this module keeps the old import path.
"""

from __future__ import annotations

from autotune.failures import (
    FATAL_WHILE_ALIVE,
    Classification,
    FailureClass,
    LogScan,
    classify_line,
    classify_log,
    explain_fault,
)

__all__ = [
    "FATAL_WHILE_ALIVE",
    "Classification",
    "FailureClass",
    "LogScan",
    "classify_line",
    "classify_log",
    "explain_fault",
]
