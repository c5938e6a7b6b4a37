"""Dependency order of services (workers before the router that fronts them).

The one topological sort of the project: the deployment model checks its ``depends_on``
with it, the launcher starts (and, reversed, stops) services in its order, and the exports
write units and command lists in it. It knows names only, so every layer can use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from autotune.errors import AutotuneError


class DependencyError(AutotuneError):
    """A dependency names an unknown service (``unknown``) or the graph has a ``cycle``; the
    deployment loader and the launcher report it as a ConfigError on ``depends_on``."""

    def __init__(
        self,
        message: str,
        *,
        service: str,
        unknown: str | None = None,
        cycle: list[str] | None = None,
    ) -> None:
        super().__init__(message)
        self.service = service
        self.unknown = unknown
        self.cycle = cycle


def dependency_order(deps: Mapping[str, Iterable[str]]) -> list[str]:
    """Services ordered so that each comes after everything it depends on.

    Ties keep the mapping's order, so the result is deterministic. Raises
    :class:`DependencyError` for an unknown name or a cycle (with the cycle's path).
    """
    graph = {name: list(dict.fromkeys(d)) for name, d in deps.items()}
    for name, ds in graph.items():
        for dep in ds:
            if dep not in graph:
                raise DependencyError(
                    f"'{name}' depends on unknown service '{dep}'", service=name, unknown=dep
                )
    order: list[str] = []
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = path[path.index(name) :] + [name]
            raise DependencyError(
                "dependency cycle: " + " -> ".join(cycle), service=name, cycle=cycle
            )
        state[name] = 1
        for dep in graph[name]:
            visit(dep, path + [name])
        state[name] = 2
        order.append(name)

    for name in graph:
        visit(name, [])
    return order
