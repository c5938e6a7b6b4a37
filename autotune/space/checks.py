"""Semantic checks of a structurally valid space file; compiles it into :class:`ParamInfo`.

Each check raises :class:`ConfigError` naming the file, the field path
(``parameters.nccl_min_nchannels.when``) and, where there is a closed set, the allowed
values. The order follows the file: space, services, each parameter (name, services, domain,
target, expressions), forbidden rules; the baseline is checked by
:func:`check_baseline` once the space can evaluate configurations.
"""

from __future__ import annotations

import keyword
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from autotune.engines import BaseEngine, get_engine
from autotune.errors import ConfigError
from autotune.pinned_env import PINNED_ENV, pinned_problem
from autotune.space.expr import (
    RESERVED_NAMES,
    Expr,
    compile_expression,
    condition_source,
)
from autotune.space.model import (
    ENV_PATTERN,
    NAME_PATTERN,
    SERVICE_PATTERN,
    BoolParam,
    CategoricalParam,
    DerivedParam,
    EnvTarget,
    FlagTarget,
    FloatParam,
    IntParam,
    MapTarget,
    SpaceFile,
    SwitchTarget,
    choice_key,
    target_kind,
)
from autotune.space.params import DomainError, ParamInfo
from autotune.space.targets import format_value, owned_env, owned_flags

_NAME_RE = re.compile(NAME_PATTERN)
_ENV_RE = re.compile(ENV_PATTERN)
_SERVICE_RE = re.compile(SERVICE_PATTERN)


@dataclass(frozen=True)
class Rule:
    """A compiled forbidden combination."""

    name: str
    reason: str
    when: Expr


class _Checker:
    def __init__(self, model: SpaceFile, file: str) -> None:
        self.model = model
        self.file = file
        self.names = list(model.parameters)
        self.engines: dict[str, BaseEngine] = {}
        for service in model.services:
            ref = model.service_engines.get(service, model.engine)
            where = f"service_engines.{service}" if service in model.service_engines else "engine"
            try:
                self.engines[service] = get_engine(ref.name, ref.version)
            except ConfigError as exc:
                field = f"{where}.{(exc.field or '').rsplit('.', 1)[-1]}" if exc.field else where
                raise ConfigError(
                    exc.message, file=file, field=field, allowed=exc.allowed
                ) from None
        for service in model.service_engines:
            if service not in model.services:
                raise self.fail(
                    f"service_engines.{service}",
                    f"'{service}' is not a service of this space",
                    allowed=model.services,
                )
        self.checking: tuple[BaseEngine, ...] = ()
        """The engines of the services of the parameter whose target is being checked."""

    def fail(
        self,
        field: str,
        message: str,
        allowed: Sequence[object] | None = None,
        *,
        closest: Sequence[object] | None = None,
    ) -> ConfigError:
        return ConfigError(message, file=self.file, field=field, allowed=allowed, closest=closest)

    # ------------------------------------------------------------------ top level

    def run(self) -> tuple[tuple[ParamInfo, ...], tuple[Rule, ...]]:
        model = self.model
        if not _SERVICE_RE.fullmatch(model.name):
            raise self.fail(
                "name", f"'{model.name}' is not a valid space name (letters, digits, '.', '_', '-')"
            )
        self.check_names_unique("services", model.services, pattern=_SERVICE_RE)
        for name in self.names:
            self.check_param_name(name)
        infos = [self.compile_param(i, name) for i, name in enumerate(self.names)]
        by_name = {info.name: info for info in infos}
        self.check_order(infos)
        self.check_ownership(infos)
        rules = tuple(self.compile_rule(i, by_name) for i in range(len(model.forbidden)))
        return tuple(infos), rules

    def check_names_unique(
        self, field: str, items: Sequence[str], *, pattern: re.Pattern[str]
    ) -> None:
        seen: set[str] = set()
        for i, item in enumerate(items):
            if not pattern.fullmatch(item):
                raise self.fail(f"{field}[{i}]", f"'{item}' is not a valid name")
            if item in seen:
                raise self.fail(f"{field}[{i}]", f"'{item}' is listed twice")
            seen.add(item)

    def check_param_name(self, name: str) -> None:
        field = f"parameters.{name}"
        if not _NAME_RE.fullmatch(name) or keyword.iskeyword(name) or name.startswith("__"):
            raise self.fail(
                field,
                f"parameter name '{name}' must be an identifier (letters, "
                "digits, '_'; not a Python keyword, not a dunder)",
            )
        if name in RESERVED_NAMES:
            raise self.fail(field, f"parameter name '{name}' is reserved", allowed=None)

    # ------------------------------------------------------------------ parameters

    def compile_param(self, index: int, name: str) -> ParamInfo:
        spec = self.model.parameters[name]
        field = f"parameters.{name}"
        services = tuple(self.model.services)
        if spec.services is not None:
            if not spec.services:
                raise self.fail(
                    f"{field}.services",
                    "must not be empty (omit it for all services)",
                    allowed=self.model.services,
                )
            for i, service in enumerate(spec.services):
                if service not in self.model.services:
                    raise self.fail(
                        f"{field}.services[{i}]",
                        f"'{service}' is not a service of this space",
                        allowed=self.model.services,
                    )
            if len(set(spec.services)) != len(spec.services):
                raise self.fail(f"{field}.services", "lists a service twice")
            services = tuple(spec.services)
        self.check_domain(field, spec)
        derived = None
        if isinstance(spec, DerivedParam):
            derived = compile_expression(
                spec.derived, names=self.names, file=self.file, field=f"{field}.derived"
            )
        when = None
        if spec.when is not None:
            when = self.compile_condition(spec.when, field=f"{field}.when")
        info = ParamInfo(
            name=name, index=index, spec=spec, services=services, when=when, derived=derived
        )
        self.check_hint(info, field)
        if spec.target is not None:
            by_kind = {(e.name, e.version): e for e in (self.engines[s] for s in services)}
            self.checking = tuple(by_kind.values())
            self.check_target(info, f"{field}.target")
        return info

    def check_domain(self, field: str, spec: object) -> None:
        if isinstance(spec, CategoricalParam):
            seen: dict[str, object] = {}
            for i, choice in enumerate(spec.choices):
                key = choice_key(choice)
                if key in seen:
                    raise self.fail(
                        f"{field}.choices[{i}]",
                        f"{choice!r} duplicates {seen[key]!r} (choices must differ as text)",
                    )
                if isinstance(choice, float) and not math.isfinite(choice):
                    raise self.fail(f"{field}.choices[{i}]", "choices must be finite")
                seen[key] = choice
        elif isinstance(spec, (IntParam, FloatParam)):
            for attr in ("low", "high", "step"):
                value = getattr(spec, attr)
                if isinstance(value, float) and not math.isfinite(value):
                    raise self.fail(f"{field}.{attr}", f"must be a finite number, got {value}")
            if spec.low >= spec.high:
                raise self.fail(
                    f"{field}.low", f"low ({spec.low}) must be below high ({spec.high})"
                )
            if spec.log and spec.step is not None:
                raise self.fail(
                    f"{field}.step",
                    "step cannot be combined with log: true "
                    "(Optuna samples log-uniformly without a grid)",
                )
            if spec.log and spec.low <= 0:
                raise self.fail(f"{field}.low", f"log: true needs low > 0, got {spec.low}")
            if spec.step is not None:
                if spec.step <= 0:
                    raise self.fail(f"{field}.step", f"step must be > 0, got {spec.step}")
                span = Decimal(repr(spec.high)) - Decimal(repr(spec.low))
                if span % Decimal(repr(spec.step)) != 0:
                    raise self.fail(
                        f"{field}.step",
                        f"step {spec.step} does not divide the range {spec.low}..{spec.high}",
                    )

    def check_hint(self, info: ParamInfo, field: str) -> None:
        """A hint's value and a default are values of the parameter (a choice, or on its
        range and step)."""
        hint = getattr(info.spec, "hint", None)
        given = [] if hint is None else [(f"{field}.hint.value", "the hint", hint.value)]
        default = getattr(info.spec, "default", None)
        if default is not None:
            given.append((f"{field}.default", "the default", default))
        for where, what, value in given:
            try:
                info.normalize(value)
            except DomainError as exc:
                raise self.fail(
                    where,
                    f"{what} is not a value of '{info.name}': {exc.message}",
                    allowed=exc.allowed or [info.domain_text()],
                ) from None

    def compile_condition(self, when: object, *, field: str) -> Expr:
        if isinstance(when, dict):
            for key, wanted in when.items():
                if key not in self.model.parameters:
                    raise self.fail(
                        f"{field}.{key}", f"unknown parameter '{key}'", allowed=self.names
                    )
                spec = self.model.parameters[key]
                if isinstance(spec, DerivedParam):
                    continue
                info = ParamInfo(
                    name=key, index=-1, spec=spec, services=(), when=None, derived=None
                )
                for value in wanted if isinstance(wanted, list) else [wanted]:
                    try:
                        info.normalize(value)
                    except DomainError as exc:
                        raise self.fail(
                            f"{field}.{key}", exc.message, allowed=exc.allowed
                        ) from None
            source = condition_source(when)
        else:
            source = str(when)
        expr = compile_expression(source, names=self.names, file=self.file, field=field)
        self.check_literals(expr, field)
        return expr

    def check_literals(self, expr: Expr, field: str) -> None:
        """``speculative == 'eagel'`` would silently never hold: refuse it."""
        for name, constants in expr.literal_comparisons():
            spec = self.model.parameters.get(name)
            if not isinstance(spec, (CategoricalParam, BoolParam)):
                continue
            info = ParamInfo(name=name, index=-1, spec=spec, services=(), when=None, derived=None)
            for constant in constants:
                try:
                    info.normalize(constant)
                except DomainError as exc:
                    raise self.fail(
                        field, f"{constant!r} is not a value of '{name}'", allowed=exc.allowed
                    ) from None

    def check_flag(self, flag: str, field: str, *, values: Sequence[object] = ()) -> None:
        """The flag exists in the engine's release, spelled in full, not deprecated, and
        every value the space can give it is one the parser accepts."""
        for engine in self.checking:
            problem = engine.check_flag(flag)
            if problem is not None and problem.severity == "error":
                raise self.fail(field, problem.message, closest=problem.suggestions)
            for value in values:
                tokens = (
                    [format_value(v) for v in value]
                    if isinstance(value, list)
                    else [format_value(value)]
                )
                bad = engine.check_values(flag, tokens)
                if bad is not None:
                    raise self.fail(field, bad.message, allowed=bad.suggestions or None)

    def check_env(self, name: str, field: str) -> None:
        if not _ENV_RE.fullmatch(name):
            raise self.fail(field, f"'{name}' is not a valid environment variable name")
        if name in PINNED_ENV:
            # Whatever the lever would set it to (the same value would be no lever at all).
            refused = pinned_problem(name, None) or ""
            raise self.fail(field, refused.replace("it cannot be unset", "no lever may touch it"))
        for engine in self.checking:
            problem = engine.check_env(name)
            if problem is not None:
                raise self.fail(field, problem.message, closest=problem.suggestions)

    def check_target(self, info: ParamInfo, field: str) -> None:
        target = info.spec.target
        kind = info.kind
        if isinstance(target, (EnvTarget, FlagTarget)):
            if isinstance(target, EnvTarget):
                self.check_env(target.env, f"{field}.env")
            else:
                self.check_flag(target.flag, f"{field}.flag", values=_flag_values(info, target))
            if target.unset_value is not None:
                if info.choices is None or kind == "bool":
                    raise self.fail(
                        f"{field}.unset_value", "unset_value only applies to categorical parameters"
                    )
                try:
                    info.normalize(target.unset_value)
                except DomainError as exc:
                    raise self.fail(
                        f"{field}.unset_value", exc.message, allowed=exc.allowed
                    ) from None
            for attr in ("true_value", "false_value"):
                if attr in target.model_fields_set and kind not in ("bool", "derived"):
                    raise self.fail(f"{field}.{attr}", f"{attr} only applies to bool parameters")
        elif isinstance(target, SwitchTarget):
            if kind not in ("bool", "derived"):
                raise self.fail(
                    f"{field}.switch", f"a switch needs a bool parameter, '{info.name}' is {kind}"
                )
            self.check_flag(target.switch, f"{field}.switch")
        elif isinstance(target, MapTarget):
            choices = info.choices
            if choices is None:
                raise self.fail(
                    f"{field}.map",
                    f"map needs a categorical or bool parameter, '{info.name}' is {kind}",
                )
            keys = [choice_key(c) for c in choices]
            for key in target.map:
                if key not in keys:
                    raise self.fail(f"{field}.map.{key}", f"'{key}' is not a choice", allowed=keys)
            missing = [k for k in keys if k not in target.map]
            if missing:
                raise self.fail(
                    f"{field}.map",
                    f"no entry for choice(s) {', '.join(missing)} (use {{}} to set nothing)",
                    allowed=keys,
                )
            for key, entry in target.map.items():
                where = f"{field}.map.{key}"
                for flag, value in entry.flags.items():
                    self.check_flag(flag, f"{where}.flags.{flag}", values=[value])
                for attr in ("switches", "remove_flags"):
                    for i, flag in enumerate(getattr(entry, attr)):
                        self.check_flag(flag, f"{where}.{attr}[{i}]")
                for name in entry.env:
                    self.check_env(name, f"{where}.env.{name}")
                for i, name in enumerate(entry.unset_env):
                    self.check_env(name, f"{where}.unset_env[{i}]")
                flag_lists = [list(entry.flags), entry.switches, entry.remove_flags]
                all_flags = [f for group in flag_lists for f in group]
                if len(all_flags) != len(set(all_flags)):
                    dup = next(f for f in all_flags if all_flags.count(f) > 1)
                    raise self.fail(where, f"flag {dup} appears more than once")
                all_env = list(entry.env) + entry.unset_env
                if len(all_env) != len(set(all_env)):
                    dup = next(n for n in all_env if all_env.count(n) > 1)
                    raise self.fail(where, f"variable {dup} appears more than once")

    # ------------------------------------------------------------------ cross-parameter

    def check_order(self, infos: Sequence[ParamInfo]) -> None:
        """Conditions and derived expressions refer to earlier parameters only: one pass in
        declaration order then evaluates everything, and cycles cannot exist."""
        position = {info.name: info.index for info in infos}
        refs = {
            info.name: set().union(*(e.names for e in (info.when, info.derived) if e is not None))
            for info in infos
        }
        for info in infos:
            for expr in (info.when, info.derived):
                if expr is None:
                    continue
                for name in sorted(expr.names, key=position.__getitem__):
                    if position[name] < info.index:
                        continue
                    if name == info.name:
                        raise self.fail(
                            expr.field, f"'{info.name}' refers to itself (conditional cycle)"
                        )
                    cycle = _path(refs, start=name, goal=info.name)
                    if cycle:
                        chain = " -> ".join([info.name, *cycle])
                        raise self.fail(expr.field, f"conditional cycle: {chain}")
                    raise self.fail(
                        expr.field,
                        f"refers to '{name}', which is declared "
                        f"later; declare '{name}' before '{info.name}'",
                        allowed=[n for n in position if position[n] < info.index],
                    )

    def check_ownership(self, infos: Sequence[ParamInfo]) -> None:
        """Two parameters setting the same flag or variable on a service would fight."""
        owners: dict[tuple[str, str], str] = {}
        for info in infos:
            target = info.spec.target
            if target is None:
                continue
            things = [f"flag {f}" for f in sorted(owned_flags(target))]
            things += [f"variable {v}" for v in sorted(owned_env(target))]
            for service in info.services:
                for thing in things:
                    other = owners.setdefault((service, thing), info.name)
                    if other != info.name:
                        raise self.fail(
                            f"parameters.{info.name}.target.{target_kind(target)}",
                            f"{thing} on service {service} is already set by parameter '{other}'",
                        )

    def compile_rule(self, index: int, by_name: Mapping[str, ParamInfo]) -> Rule:
        rule = self.model.forbidden[index]
        field = f"forbidden[{index}]"
        if not _NAME_RE.fullmatch(rule.name):
            raise self.fail(f"{field}.name", f"'{rule.name}' must be an identifier")
        for other in self.model.forbidden[:index]:
            if other.name == rule.name:
                raise self.fail(f"{field}.name", f"rule name '{rule.name}' is used twice")
        if not rule.reason.strip():
            raise self.fail(f"{field}.reason", "must say why the combination is forbidden")
        when = self.compile_condition(rule.when, field=f"{field}.when")
        return Rule(name=rule.name, reason=rule.reason, when=when)


def _flag_values(info: ParamInfo, target: FlagTarget) -> list[object]:
    """The values a flag target can emit, when they are a closed set (choices, bools)."""
    if info.kind == "bool":
        return [target.true_value, target.false_value]
    if info.choices is None:
        return []
    return [c for c in info.choices if target.unset_value is None or c != target.unset_value]


def _path(refs: Mapping[str, set[str]], *, start: str, goal: str) -> list[str]:
    """A reference chain from ``start`` to ``goal`` (empty when there is none)."""
    stack: list[tuple[str, list[str]]] = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, chain = stack.pop()
        if node == goal:
            return chain
        if node in seen:
            continue
        seen.add(node)
        for nxt in sorted(refs.get(node, ())):
            stack.append((nxt, [*chain, nxt]))
    return []


def compile_space(model: SpaceFile, *, file: str) -> tuple[tuple[ParamInfo, ...], tuple[Rule, ...]]:
    """Check ``model`` and compile its parameters and forbidden rules."""
    return _Checker(model, file).run()
