"""``autotune space check``: what a space contains, in numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from autotune.space.loader import load_space
from autotune.space.searchspace import SearchSpace


@dataclass(frozen=True)
class SpaceSummary:
    """Counts that tell whether a space is what its author meant.

    ``approx_size`` is an upper bound on the number of distinct configurations: the product
    of each sampled parameter's number of values, plus one ("inactive") for conditional
    ones; forbidden rules are ignored; ``inf`` when a float has no step.
    """

    name: str
    file: str
    services: tuple[str, ...]
    by_type: dict[str, int] = field(default_factory=dict)
    conditional: int = 0
    derived: int = 0
    forbidden: int = 0
    baseline_valid: bool = False
    approx_size: float = 0.0
    hints: tuple[tuple[str, object, float], ...] = ()
    """(parameter, hinted value, strength) of every hinted parameter, in file order."""

    @property
    def parameters(self) -> int:
        """Sampled parameters (derived ones are counted in ``derived``)."""
        return sum(self.by_type.values())

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def lines(self) -> list[str]:
        """Human-readable lines for the CLI."""
        types = ", ".join(f"{n} {t}" for t, n in self.by_type.items() if n)
        size = (
            "infinite (continuous floats)"
            if math.isinf(self.approx_size)
            else (f"~{self.approx_size:.3g}")
        )
        return [
            f"space {self.name} ({self.file})",
            f"services: {', '.join(self.services)}",
            f"parameters: {self.parameters} sampled ({types}), {self.conditional} conditional, "
            f"{self.derived} derived",
            f"forbidden rules: {self.forbidden}",
            "baseline: " + ("valid" if self.baseline_valid else "none"),
            "hints: "
            + (
                ", ".join(f"{n}={v!r} (strength {s:g})" for n, v, s in self.hints)
                if self.hints
                else "none"
            ),
            f"configurations (upper bound): {size}",
        ]


def summarize(space: SearchSpace) -> SpaceSummary:
    """The summary of a loaded space."""
    by_type = {"categorical": 0, "int": 0, "float": 0, "bool": 0}
    size = 1.0
    for param in space.sampled_params:
        by_type[param.kind] += 1
        size *= param.cardinality() + (1 if param.when is not None else 0)
    return SpaceSummary(
        name=space.name,
        file=space.file,
        services=space.services,
        by_type=by_type,
        conditional=sum(1 for p in space.params if p.when is not None),
        derived=sum(1 for p in space.params if not p.sampled),
        forbidden=len(space.rules),
        baseline_valid=space.has_baseline,
        approx_size=size,
        hints=tuple((name, value, strength) for name, (value, strength) in space.hints().items()),
    )


def check_space(path: str | Path) -> SpaceSummary:
    """Load ``path`` (raising :class:`ConfigError` on any problem, baseline included) and
    summarise it. ``baseline_valid`` is false only when the file has no baseline."""
    return summarize(load_space(path))
