"""The ``hosts:`` map of a deployment, as the remote package has always exported it.

The model lives in :mod:`autotune.hosts`: it is configuration (the deployment file's
``hosts:``), so the deployment model must be able to load it without a launcher.
"""

from __future__ import annotations

from autotune.hosts import SUDO_POLICIES, HostSpec, SudoPolicy, parse_hosts, validate_hosts

__all__ = ["SUDO_POLICIES", "HostSpec", "SudoPolicy", "parse_hosts", "validate_hosts"]
