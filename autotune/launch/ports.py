"""Local TCP port checks, as the launcher package has always exported them.

They live in :mod:`autotune.ports` (the deployment model picks ports, the local service
manager waits for them); this module keeps the old import path.
"""

from __future__ import annotations

from autotune.ports import is_port_free, pick_free_ports, wait_port_free

__all__ = ["is_port_free", "pick_free_ports", "wait_port_free"]
