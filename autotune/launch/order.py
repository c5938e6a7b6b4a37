"""Dependency order of services, as the launcher package has always exported it.

The one topological sort lives in :mod:`autotune.dependencies` (the deployment model, the
launcher and the exports all order services with it); this module keeps the old import path.
"""

from __future__ import annotations

from autotune.dependencies import DependencyError, dependency_order

__all__ = ["DependencyError", "dependency_order"]
