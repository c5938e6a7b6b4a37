"""A parameter after loading: its domain, its condition, its expression, its target.

:class:`ParamInfo` is what sampling, validation and rendering work with; it knows how to
check and normalise a value (floats are rounded to their step so that ``0.7100000000000001``
from a sampler becomes ``0.71`` in flags and duplicate detection).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from autotune.errors import AutotuneError
from autotune.space.expr import Expr, same_value
from autotune.space.model import (
    AnyParam,
    BoolParam,
    CategoricalParam,
    DerivedParam,
    EnvTarget,
    FlagTarget,
    FloatParam,
    IntParam,
    Value,
)

BOOL_CHOICES: tuple[bool, bool] = (False, True)


class DomainError(AutotuneError):
    """A value is outside a parameter's domain; ``allowed`` lists a closed set if any. Where
    the value is one a user wrote, the caller reports a ConfigError naming file and field."""

    def __init__(self, message: str, allowed: list[object] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.allowed = allowed


def decimals(value: float) -> int:
    """Digits after the decimal point of a number as written (``0.01`` -> 2)."""
    try:
        exponent = Decimal(repr(value)).normalize().as_tuple().exponent
    except InvalidOperation:
        return 0
    return max(0, -exponent) if isinstance(exponent, int) else 0


@dataclass(frozen=True)
class ParamInfo:
    """One parameter of a loaded space."""

    name: str
    index: int
    spec: AnyParam
    services: tuple[str, ...]
    when: Expr | None
    derived: Expr | None

    @property
    def kind(self) -> str:
        """categorical, int, float, bool or derived."""
        return "derived" if isinstance(self.spec, DerivedParam) else self.spec.type

    @property
    def sampled(self) -> bool:
        return not isinstance(self.spec, DerivedParam)

    @property
    def engine_default(self) -> Value | None:
        """The engine's own value when the lever is not set: the space's ``default``, else
        the ``unset_value`` of its flag or environment variable (the choice that removes it;
        None when the space says neither)."""
        spec = self.spec
        if isinstance(spec, DerivedParam):
            return None
        value = spec.default
        if value is None and isinstance(spec.target, (FlagTarget, EnvTarget)):
            value = spec.target.unset_value
        return None if value is None else self.normalize(value)

    @property
    def choices(self) -> tuple[Value, ...] | None:
        """The closed set of values (categorical, bool), else ``None``."""
        if isinstance(self.spec, CategoricalParam):
            return tuple(self.spec.choices)
        if isinstance(self.spec, BoolParam):
            return BOOL_CHOICES
        return None

    @property
    def step(self) -> float | int | None:
        spec = self.spec
        if isinstance(spec, IntParam):
            return spec.step if spec.step is not None else 1
        if isinstance(spec, FloatParam):
            return spec.step
        return None

    @property
    def float_decimals(self) -> int | None:
        """Rounding for a stepped float: the digits of low and step."""
        spec = self.spec
        if isinstance(spec, FloatParam) and spec.step is not None:
            return max(decimals(spec.step), decimals(spec.low))
        return None

    def domain_text(self) -> str:
        spec = self.spec
        if isinstance(spec, (IntParam, FloatParam)):
            text = f"{spec.low}..{spec.high}"
            if spec.step is not None:
                text += f" step {spec.step}"
            return text + (" (log)" if spec.log else "")
        if self.choices is not None:
            return ", ".join(map(repr, self.choices))
        return "derived"

    def cardinality(self) -> float:
        """Number of distinct values (``inf`` for a continuous float)."""
        spec = self.spec
        if self.choices is not None:
            return float(len(self.choices))
        if isinstance(spec, IntParam):
            step = spec.step or 1
            return float((spec.high - spec.low) // step + 1)
        if isinstance(spec, FloatParam):
            if spec.step is None:
                return math.inf
            return float(round((spec.high - spec.low) / spec.step) + 1)
        return 1.0

    def normalize(self, value: object) -> Value:
        """``value`` checked against the domain (rounded for stepped floats).

        Raises :class:`DomainError`.
        """
        spec = self.spec
        choices = self.choices
        if choices is not None:
            for choice in choices:
                if same_value(choice, value):
                    return choice
            raise DomainError(f"{value!r} is not one of the choices", list(choices))
        if isinstance(spec, IntParam):
            if not isinstance(value, int) or isinstance(value, bool):
                raise DomainError(f"expected an integer, got {value!r}")
            if not spec.low <= value <= spec.high:
                raise DomainError(f"{value} is outside {self.domain_text()}")
            step = spec.step or 1
            if (value - spec.low) % step:
                raise DomainError(f"{value} is not on the grid {self.domain_text()}")
            return value
        if isinstance(spec, FloatParam):
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise DomainError(f"expected a number, got {value!r}")
            number = float(value)
            tolerance = 1e-9 * max(1.0, abs(spec.high - spec.low))
            if not math.isfinite(number) or not (
                spec.low - tolerance <= number <= spec.high + tolerance
            ):
                raise DomainError(f"{value} is outside {self.domain_text()}")
            number = min(max(number, spec.low), spec.high)
            if spec.step is not None:
                k = (number - spec.low) / spec.step
                if abs(k - round(k)) > 1e-6:
                    raise DomainError(f"{value} is not on the grid {self.domain_text()}")
                places = self.float_decimals or 0
                number = round(spec.low + round(k) * spec.step, places)
            return number
        raise DomainError("derived parameters take no value")
