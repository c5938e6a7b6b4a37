"""The loaded search space: sampling, completion, constraints and service settings.

A *configuration* (``TrialConfig``) is a dict of the active parameters in declaration order
plus the derived ones. Every method walks the parameters in declaration order: a parameter
is active when its ``when`` holds on the values so far (a condition that mentions an
inactive parameter is false), and a derived parameter is computed when it is active and
everything it mentions is.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.engines import EngineRef

if TYPE_CHECKING:  # sampling is the study's business; reading a space loads no Optuna
    from optuna.distributions import BaseDistribution
    from optuna.trial import BaseTrial
from autotune.errors import ConfigError
from autotune.space.checks import Rule
from autotune.space.expr import Expr, same_value
from autotune.space.model import FloatParam, IntParam, SpaceFile, Value
from autotune.space.params import DomainError, ParamInfo
from autotune.space.sampling import distribution, grid_values, random_value, suggest_value
from autotune.space.settings import ServiceSettings
from autotune.space.targets import apply_inactive, apply_value

TrialConfig = dict[str, Value]
"""Active and derived parameters, in declaration order."""


@dataclass(frozen=True)
class Violation:
    """A forbidden combination that a configuration hits."""

    name: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}"


@dataclass(frozen=True)
class Translation:
    """Sampled values of another version of a space carried into this one
    (:meth:`SearchSpace.translate`), and what had to change, lever by lever."""

    params: dict[str, Value]
    """This space's sampled values (the ones the configuration makes active)."""
    dropped: dict[str, object]
    """Levers this space no longer has, with the value they had."""
    replaced: dict[str, tuple[object, Value]]
    """Levers whose value this space no longer allows: (old value, the value taken)."""
    filled: dict[str, Value]
    """Levers active here that the configuration did not set (new ones, or switched on by
    a changed condition), with the value taken (the baseline's where it has one)."""
    inactive: dict[str, object]
    """Levers this space has but the translated configuration leaves inactive (dropped)."""
    violations: tuple[Violation, ...] = ()
    """Forbidden rules of this space that the translated configuration hits."""

    @property
    def unchanged(self) -> bool:
        return not (self.dropped or self.replaced or self.filled or self.inactive)

    def notes(self) -> list[str]:
        """Each change in words (``'x' is gone (was 4)``)."""
        out = [f"{n!r} is gone (was {v!r})" for n, v in self.dropped.items()]
        out += [
            f"{n!r}={old!r} is no longer allowed: {new!r} taken"
            for n, (old, new) in self.replaced.items()
        ]
        out += [f"{n!r} was not set: {v!r} taken" for n, v in self.filled.items()]
        out += [f"{n!r}={v!r} dropped (inactive here)" for n, v in self.inactive.items()]
        out += [f"hits forbidden rule {v}" for v in self.violations]
        return out


class SearchSpace:
    """A validated search space; build it with :func:`autotune.space.load_space`."""

    def __init__(
        self,
        *,
        model: SpaceFile,
        params: tuple[ParamInfo, ...],
        rules: tuple[Rule, ...],
        file: str,
    ) -> None:
        self.model = model
        self.params = params
        self.rules = rules
        self.file = file
        self._by_name = {p.name: p for p in params}

    # ------------------------------------------------------------------ description

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def description(self) -> str:
        return self.model.description

    @property
    def services(self) -> tuple[str, ...]:
        return tuple(self.model.services)

    def engine_ref(self, service: str) -> EngineRef:
        """The engine (and release) ``service`` runs: its own in ``service_engines``, else
        the space's."""
        return self.model.service_engines.get(service, self.model.engine)

    @property
    def sampled_params(self) -> tuple[ParamInfo, ...]:
        return tuple(p for p in self.params if p.sampled)

    @property
    def has_baseline(self) -> bool:
        return self.model.baseline is not None

    def parameter(self, name: str) -> ParamInfo:
        """The parameter called ``name`` (:class:`ConfigError` listing names otherwise)."""
        try:
            return self._by_name[name]
        except KeyError:
            raise ConfigError(
                f"unknown parameter '{name}'",
                file=self.file,
                field="parameters",
                allowed=list(self._by_name),
            ) from None

    def __repr__(self) -> str:
        return f"SearchSpace({self.name!r}, {len(self.params)} parameters)"

    # ------------------------------------------------------------------ the walk

    def _holds(self, expr: Expr, config: Mapping[str, object]) -> bool:
        if not expr.names <= config.keys():
            return False
        value = expr.evaluate(config)
        if not isinstance(value, bool):
            raise ConfigError(
                f"condition {expr.source!r} must be true or false, got {value!r}",
                file=self.file,
                field=expr.field,
            )
        return value

    def _walk(self, pick: Callable[[ParamInfo], Value]) -> TrialConfig:
        config: TrialConfig = {}
        for param in self.params:
            if param.when is not None and not self._holds(param.when, config):
                continue
            if param.sampled:
                config[param.name] = pick(param)
                continue
            assert param.derived is not None
            if not param.derived.names <= config.keys():
                continue
            value = param.derived.evaluate(config)
            if not isinstance(value, (bool, int, float, str)) or (
                isinstance(value, float) and not math.isfinite(value)
            ):
                raise ConfigError(
                    f"derived value {value!r} is not a string, number or true/false",
                    file=self.file,
                    field=param.derived.field,
                )
            config[param.name] = value
        return config

    def _resolve(self, values: Mapping[str, object], *, where: str, strict: bool) -> TrialConfig:
        for name in values:
            if name not in self._by_name:
                raise ConfigError(
                    f"unknown parameter '{name}'",
                    file=self.file,
                    field=f"{where}.{name}",
                    allowed=list(self._by_name),
                )

        def pick(param: ParamInfo) -> Value:
            if param.name not in values:
                choices = param.choices
                raise ConfigError(
                    f"missing a value for active parameter '{param.name}'"
                    + ("" if choices else f" ({param.domain_text()})"),
                    file=self.file,
                    field=f"{where}.{param.name}",
                    allowed=list(choices) if choices else None,
                )
            try:
                return param.normalize(values[param.name])
            except DomainError as exc:
                raise ConfigError(
                    exc.message, file=self.file, field=f"{where}.{param.name}", allowed=exc.allowed
                ) from None

        config = self._walk(pick)
        if strict:
            for name, value in values.items():
                param = self._by_name[name]
                if name not in config:
                    why = (
                        f"its condition {param.when.source!r} is false"
                        if param.when
                        else ("a parameter it refers to is inactive")
                    )
                    raise ConfigError(
                        f"'{name}' is inactive here ({why}); remove it",
                        file=self.file,
                        field=f"{where}.{name}",
                    )
                if not param.sampled and not same_value(value, config[name]):
                    raise ConfigError(
                        f"given as {value!r} but derived as {config[name]!r}",
                        file=self.file,
                        field=f"{where}.{name}",
                    )
        return config

    # ------------------------------------------------------------------ configurations

    def suggest(self, trial: BaseTrial) -> TrialConfig:
        """Active parameters suggested through ``trial`` in declaration order, plus derived
        ones. Inactive parameters are not suggested at all."""
        return self._walk(lambda p: suggest_value(trial, p))

    def complete(self, params: Mapping[str, object]) -> TrialConfig:
        """The full configuration from sampled values (``trial.params``, a baseline):
        validated, stepped floats rounded, inactive values dropped, derived ones (re)computed.
        """
        return self._resolve(params, where="config", strict=False)

    def random_config(
        self,
        rng: random.Random,
        *,
        avoid_forbidden: bool = False,
        max_tries: int = 1000,
    ) -> TrialConfig:
        """A random configuration that respects every ``when``; with ``avoid_forbidden`` one
        that also violates no forbidden rule (:class:`ConfigError` after ``max_tries``)."""
        for _ in range(max_tries):
            config = self._walk(lambda p: random_value(rng, p))
            if not avoid_forbidden or not self.violations(config):
                return config
        raise ConfigError(
            f"no configuration without a forbidden combination in {max_tries} random draws",
            file=self.file,
            field="forbidden",
        )

    def baseline_params(self) -> dict[str, Value]:
        """The baseline's sampled values, for ``study.enqueue_trial``."""
        if self.model.baseline is None:
            raise ConfigError("the space has no baseline", file=self.file, field="baseline")
        config = self._resolve(self.model.baseline, where="baseline", strict=True)
        return {p.name: config[p.name] for p in self.params if p.sampled and p.name in config}

    def variant_params(
        self, changes: Mapping[str, object], *, where: str, file: str | None = None
    ) -> dict[str, Value]:
        """The baseline with ``changes`` applied, as sampled values (a study's ``enqueue:``
        entry names only what differs). Baseline values the changes make inactive are
        dropped; a change that is itself inactive, unknown or out of range is a
        :class:`ConfigError` naming ``file`` (default: the space's) and ``where.NAME``."""
        base = dict(self.model.baseline or {})
        unknown = [name for name in changes if name not in self._by_name]
        if unknown:
            raise ConfigError(
                f"unknown parameter '{unknown[0]}'",
                file=file or self.file,
                field=f"{where}.{unknown[0]}",
                allowed=list(self._by_name),
            )
        try:
            config = self._resolve({**base, **changes}, where=where, strict=False)
        except ConfigError as exc:
            raise ConfigError(
                exc.message, file=file or self.file, field=exc.field, allowed=exc.allowed
            ) from None
        for name in changes:
            param = self._by_name[name]
            if name not in config:
                raise ConfigError(
                    f"'{name}' is inactive in this configuration; remove it or change what "
                    "it depends on",
                    file=file or self.file,
                    field=f"{where}.{name}",
                )
            if not param.sampled:
                raise ConfigError(
                    f"'{name}' is derived, not sampled: it cannot be set",
                    file=file or self.file,
                    field=f"{where}.{name}",
                )
        return {p.name: config[p.name] for p in self.params if p.sampled and p.name in config}

    def hints(self) -> dict[str, tuple[Value, float]]:
        """Parameter -> (hinted value, strength) for every parameter with a ``hint``, in
        declaration order (values normalised like a sampled one)."""
        out: dict[str, tuple[Value, float]] = {}
        for param in self.sampled_params:
            hint = getattr(param.spec, "hint", None)
            if hint is not None:
                out[param.name] = (param.normalize(hint.value), float(hint.strength))
        return out

    def translate(self, params: Mapping[str, object]) -> Translation:
        """Sampled values written for another version of this space (an earlier study's
        trial), made a configuration of this one: levers it no longer has are dropped, a
        value it no longer allows becomes the baseline's (numbers without one: the nearest
        value of the new range), a lever now active that ``params`` did not set takes the
        baseline's value (else its hint, else the first choice or the low end), and levers
        the result leaves inactive are dropped; forbidden rules it hits are listed."""
        baseline = self.baseline_params() if self.has_baseline else {}
        hints = self.hints()
        dropped = {n: v for n, v in params.items() if n not in self._by_name}
        replaced: dict[str, tuple[object, Value]] = {}
        filled: dict[str, Value] = {}

        def fallback(param: ParamInfo, old: object) -> Value:
            if param.name in baseline:
                return baseline[param.name]
            spec = param.spec
            if old is not None and isinstance(spec, (IntParam, FloatParam)):
                try:
                    return _nearest(param, float(old))  # type: ignore[arg-type]
                except (TypeError, ValueError):
                    pass
            if param.name in hints:
                return hints[param.name][0]
            if param.choices is not None:
                return param.choices[0]
            assert isinstance(spec, (IntParam, FloatParam))
            return param.normalize(spec.low)

        def pick(param: ParamInfo) -> Value:
            if param.name not in params:
                filled[param.name] = fallback(param, None)
                return filled[param.name]
            old = params[param.name]
            try:
                return param.normalize(old)
            except DomainError:
                value = fallback(param, old)
                replaced[param.name] = (old, value)
                return value

        config = self._walk(pick)
        inactive = {n: v for n, v in params.items() if n in self._by_name and n not in config}
        sampled = {p.name: config[p.name] for p in self.params if p.sampled and p.name in config}
        hits = tuple(Violation(r.name, r.reason) for r in self.rules if self._holds(r.when, config))
        return Translation(
            params=sampled,
            dropped=dropped,
            replaced=replaced,
            filled=filled,
            inactive=inactive,
            violations=hits,
        )

    def baseline_config(self) -> TrialConfig:
        """The baseline as a complete configuration (with derived values)."""
        return self.complete(self.baseline_params())

    def violations(self, config: Mapping[str, object]) -> list[Violation]:
        """The forbidden rules ``config`` hits (a rule mentioning an inactive parameter
        does not apply)."""
        resolved = self.complete(config)
        return [Violation(r.name, r.reason) for r in self.rules if self._holds(r.when, resolved)]

    def config_key(self, config: Mapping[str, object]) -> str:
        """Canonical hash of the active sampled values, for duplicate detection: stepped
        floats rounded to their step, continuous ones to 12 significant digits, inactive
        and derived values ignored."""
        resolved = self.complete(config)
        items: list[list[object]] = []
        for param in self.sampled_params:
            if param.name not in resolved:
                continue
            value = resolved[param.name]
            if isinstance(param.spec, FloatParam) and param.spec.step is None:
                value = float(f"{float(value):.12g}")  # type: ignore[arg-type]
            items.append([param.name, value])
        text = json.dumps(items, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    # ------------------------------------------------------------------ Optuna helpers

    def distributions(self) -> dict[str, BaseDistribution]:
        """The distribution of every sampled parameter (conditional ones included)."""
        return {p.name: distribution(p) for p in self.sampled_params}

    def grid(self, *, levels: int = 3) -> dict[str, list[Value]]:
        """A finite grid for ``optuna.samplers.GridSampler``.

        Every sampled parameter (conditional ones too: GridSampler needs every name it may be
        asked for) with all choices of categorical/bool parameters and ``levels`` values
        of numeric ones (see :func:`sampling.grid_values`; the baseline value is added).
        The grid is the product of these lists, so it grows fast: use it for small spaces
        or pass a trimmed copy. Grid points that differ only in inactive parameters give
        the same configuration; :meth:`config_key` detects those.
        """
        if levels < 2:
            raise ValueError("levels must be at least 2")
        baseline = self.baseline_params() if self.has_baseline else {}
        return {
            p.name: grid_values(
                p, levels=levels, include=[baseline[p.name]] if p.name in baseline else []
            )
            for p in self.sampled_params
        }

    # ------------------------------------------------------------------ rendering

    def settings_for(self, service: str, config: Mapping[str, object]) -> ServiceSettings:
        """Flags and environment for ``service`` under ``config``.

        Parameters not scoped to ``service`` are left out; a service the space does not
        list (a router) gets empty settings. Inactive parameters remove what they own.
        """
        resolved = self.complete(config)
        settings = ServiceSettings()
        if service not in self.services:
            return settings
        for param in self.params:
            target = param.spec.target
            if target is None or service not in param.services:
                continue
            if param.name not in resolved:
                apply_inactive(target, settings)
                continue
            try:
                apply_value(
                    target, resolved[param.name], settings, float_decimals=param.float_decimals
                )
            except (TypeError, KeyError) as exc:
                raise ConfigError(
                    f"cannot apply value {resolved[param.name]!r}: {exc}",
                    file=self.file,
                    field=f"parameters.{param.name}.target",
                ) from None
        return settings


def _nearest(param: ParamInfo, number: float) -> Value:
    """The value of a numeric ``param`` nearest to ``number`` (clamped, on the step)."""
    spec = param.spec
    assert isinstance(spec, (IntParam, FloatParam))
    x = min(max(number, float(spec.low)), float(spec.high))
    step = param.step
    if step is not None:
        x = float(spec.low) + float(step) * round((x - float(spec.low)) / float(step))
        x = min(x, float(spec.high))  # the step divides the range: high is on the grid
    if isinstance(spec, IntParam):
        return param.normalize(int(round(x)))
    return param.normalize(x)
