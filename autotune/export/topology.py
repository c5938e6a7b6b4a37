"""Which service needs which: start order for units, install scripts and command lists.

Studies that store ``depends_on`` per service are used as they are. Older records lack it;
then a service depends on every other service whose ``--port`` it names in a URL (the PD
router's ``--prefill http://host:P1`` / ``--decode http://host:P2``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from autotune.dependencies import DependencyError, dependency_order
from autotune.errors import ConfigError
from autotune.results import ServiceRecord


def dependencies(services: Mapping[str, ServiceRecord]) -> dict[str, list[str]]:
    """``{service: [services it needs]}``, stored or inferred from the command lines."""
    if any(rec.depends_on is not None for rec in services.values()):
        deps = {name: list(rec.depends_on or []) for name, rec in services.items()}
    else:
        deps = {name: _inferred(name, services) for name in services}
    for name, needs in deps.items():
        unknown = [n for n in needs if n not in services]
        if unknown:
            raise ConfigError(
                f"service '{name}' depends on unknown service(s) {unknown}",
                field="services",
                allowed=sorted(services),
            )
    return deps


def start_order(services: Mapping[str, ServiceRecord]) -> list[str]:
    """Services in an order where each comes after what it needs (stable, cycle-checked)."""
    try:
        return dependency_order(dependencies(services))
    except DependencyError as exc:
        raise ConfigError(
            f"services depend on each other in a cycle: {' -> '.join(exc.cycle or [])}",
            field="services",
        ) from None


def _port(rec: ServiceRecord) -> str | None:
    argv = rec.argv
    for i, arg in enumerate(argv):
        if arg == "--port" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--port="):
            return arg.split("=", 1)[1]
    return None


def _inferred(name: str, services: Mapping[str, ServiceRecord]) -> list[str]:
    mine = services[name]
    needs: list[str] = []
    for other, rec in services.items():
        port = _port(rec)
        if other == name or port is None:
            continue
        pattern = re.compile(rf"://[^/\s]*:{re.escape(port)}(?:/|$)")
        if any(pattern.search(arg) for arg in mine.argv):
            needs.append(other)
    return needs
