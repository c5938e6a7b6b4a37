"""How values are drawn: Optuna ``suggest_*``, distributions, a finite grid, plain random.

Each function maps one sampled :class:`ParamInfo` to a value; the space walks its parameters
in declaration order and only asks for active ones, so Optuna sees a parameter under the
same name with the same distribution every time (what TPE with ``group=True`` needs for
conditional spaces).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from autotune.space.model import FloatParam, IntParam, Value
from autotune.space.params import ParamInfo

if TYPE_CHECKING:  # a space is read by code that never samples (the trial pipeline, checks)
    from optuna.distributions import BaseDistribution
    from optuna.trial import BaseTrial


def distribution(param: ParamInfo) -> BaseDistribution:
    """The Optuna distribution ``suggest`` uses for ``param``."""
    # Imported here: only the study side asks for distributions, and loading a space must
    # not load Optuna (the trial pipeline imports no Optuna: an import contract checks it).
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    spec = param.spec
    if param.choices is not None:
        return CategoricalDistribution(list(param.choices))  # type: ignore[arg-type]
    if isinstance(spec, IntParam):
        return IntDistribution(spec.low, spec.high, log=spec.log, step=spec.step or 1)
    if isinstance(spec, FloatParam):
        return FloatDistribution(spec.low, spec.high, log=spec.log, step=spec.step)
    raise TypeError(f"{param.name} is derived, not sampled")


def suggest_value(trial: BaseTrial, param: ParamInfo) -> Value:
    """Ask ``trial`` for a value of ``param`` (normalised: stepped floats rounded)."""
    spec = param.spec
    value: Any
    if param.choices is not None:
        value = trial.suggest_categorical(param.name, list(param.choices))  # type: ignore[arg-type]
    elif isinstance(spec, IntParam):
        value = trial.suggest_int(
            param.name, spec.low, spec.high, step=spec.step or 1, log=spec.log
        )
    elif isinstance(spec, FloatParam):
        value = trial.suggest_float(param.name, spec.low, spec.high, step=spec.step, log=spec.log)
    else:
        raise TypeError(f"{param.name} is derived, not sampled")
    return param.normalize(value)


def random_value(rng: random.Random, param: ParamInfo) -> Value:
    """A value drawn like Optuna's RandomSampler would (uniform, log-uniform, on the grid)."""
    spec = param.spec
    value: Any
    if param.choices is not None:
        value = rng.choice(param.choices)
    elif isinstance(spec, IntParam):
        if spec.log:
            value = round(math.exp(rng.uniform(math.log(spec.low), math.log(spec.high))))
            value = min(max(value, spec.low), spec.high)
        else:
            step = spec.step or 1
            value = spec.low + step * rng.randrange((spec.high - spec.low) // step + 1)
    elif isinstance(spec, FloatParam):
        if spec.step is not None:
            value = spec.low + spec.step * rng.randrange(int(param.cardinality()))
        elif spec.log:
            value = math.exp(rng.uniform(math.log(spec.low), math.log(spec.high)))
        else:
            value = rng.uniform(spec.low, spec.high)
    else:
        raise TypeError(f"{param.name} is derived, not sampled")
    return param.normalize(value)


def grid_values(param: ParamInfo, *, levels: int, include: Sequence[Value] = ()) -> list[Value]:
    """A few values of ``param`` for a grid search.

    Categorical and bool parameters give every choice. A numeric parameter gives ``levels``
    values evenly spread from low to high (geometrically when ``log``), snapped to its step
    (all of them when it has no more than ``levels`` values), plus the values in
    ``include`` (the baseline), so the grid always contains today's deployment.
    """
    if param.choices is not None:
        return list(param.choices)
    spec = param.spec
    if not isinstance(spec, (IntParam, FloatParam)):
        raise TypeError(f"{param.name} is derived, not sampled")
    raw: list[float]
    if param.cardinality() <= levels:
        count = int(param.cardinality())
        raw = [spec.low + (param.step or 1) * k for k in range(count)]
    elif spec.log:
        ratio = spec.high / spec.low
        raw = [spec.low * ratio ** (k / (levels - 1)) for k in range(levels)]
    else:
        raw = [spec.low + (spec.high - spec.low) * k / (levels - 1) for k in range(levels)]
    values: list[Value] = []
    for number in [*raw, *include]:
        snapped = _snap(param, float(number))  # type: ignore[arg-type]
        if snapped not in values:
            values.append(snapped)
    return sorted(values)  # type: ignore[type-var]


def _snap(param: ParamInfo, number: float) -> Value:
    spec = param.spec
    step = param.step
    if isinstance(spec, IntParam):
        step_i = spec.step or 1
        k = round((number - spec.low) / step_i)
        return param.normalize(min(max(spec.low + k * step_i, spec.low), spec.high))
    assert isinstance(spec, FloatParam)
    if step is not None:
        k = round((number - spec.low) / step)
        number = spec.low + k * step
    else:
        number = float(f"{number:.12g}")
    return param.normalize(min(max(number, spec.low), spec.high))
